"""The one interface every routing policy implements.

A policy is a decision over plain data: the request (its tokens) and what is known of each replica
(how much of this request it has cached, its load). The simulator, the gateway and the local fleet
build these views from their own sources and call the same ``choose``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

ReplicaId = int | str


@dataclass(frozen=True, slots=True)
class CostModel:
    """Engine timing used to turn tokens into seconds (calibrated per engine/model)."""

    prefill_s_per_token: float = 0.0000333  # ~30k tok/s: an 8B model on one H100
    cached_s_per_token: float = 0.0  # lookup cost of a cached token
    request_overhead_s: float = 0.0  # fixed per-request cost (scheduling, first decode step)

    def prefill_s(self, total_tokens: int, matched_tokens: int) -> float:
        uncached = max(total_tokens - matched_tokens, 0)
        return (
            self.request_overhead_s
            + uncached * self.prefill_s_per_token
            + matched_tokens * self.cached_s_per_token
        )


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One request to place. ``tokens`` are encoded as in :func:`prefixfleet.router.radix.as_token_bytes`."""

    tokens: bytes
    num_tokens: int
    now: float = 0.0
    namespace: object = None
    max_new_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a policy may know about one replica at decision time."""

    replica_id: ReplicaId
    matched_tokens: int = 0  # longest cached prefix of *this* request on the replica
    cached_tokens: int = 0
    capacity_tokens: int = 0
    in_flight: int = 0  # requests admitted and not finished (running + queued)
    queued: int = 0  # of those, not yet started prefill
    pending_prefill_tokens: int = 0  # uncached tokens still to prefill for queued/running requests
    wait_s: float = 0.0  # estimated wait before this request's prefill could start
    healthy: bool = True
    # What the replica's sidecar counted of ALL its traffic, whatever gateway sent it, as of
    # ``reported_at`` (wall seconds: its load record's ``ts``): a DecayedRate over RATE_WINDOW_S of
    # its arrivals and of the uncached tokens they wrote to its cache. None: not reported (a static
    # worker, a sidecar that predates them, the simulator); a policy then counts its own sends only.
    reported_arrivals_per_s: float | None = None
    reported_write_tokens_per_s: float | None = None
    reported_at: float = 0.0


# The window sidecars decay their published rates over, and queue_aware's default ``window_s``: one
# number, so a gateway's own count and a sidecar's report of the same sends are like terms.
RATE_WINDOW_S = 10.0


class DecayedRate:
    """An exponentially decayed sum, read as a rate per second over ``window_s``.

    One type for every decayed rate of the routing layer: queue_aware's count of its own sends and
    a sidecar's count of every request its worker gets (published in its load record), so the two
    combine with the same semantics."""

    __slots__ = ("t", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.t = 0.0

    def add(self, amount: float, now: float, window_s: float) -> None:
        self.value = self.rate(now, window_s) * window_s + amount
        self.t = now

    def rate(self, now: float, window_s: float) -> float:
        return self.value * math.exp(-max(now - self.t, 0.0) / window_s) / window_s


@dataclass(frozen=True, slots=True)
class Decision:
    replica_id: ReplicaId
    reason: str  # small fixed vocabulary per policy: safe as a metric label
    expected_matched_tokens: int = 0
    scores: dict[ReplicaId, float] = field(default_factory=dict, compare=False, repr=False)


class NoReplicaError(RuntimeError):
    """No healthy replica to route to."""


class RoutingPolicy(ABC):
    """Base of all policies: ``choose`` one replica; optionally learn from what was routed."""

    name: ClassVar[str]
    reasons: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cost: CostModel | None = None) -> None:
        self.cost = cost or CostModel()

    @abstractmethod
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        """Pick one of ``replicas`` (only healthy ones are offered) for ``request``."""

    def on_routed(self, request: RouteRequest, decision: Decision) -> None:  # noqa: B027
        """Feedback after the request was sent where ``decision`` said (stateful policies)."""

    def on_replica_removed(self, replica_id: ReplicaId) -> None:  # noqa: B027
        """Forget a replica that left the fleet."""

    def estimated_ttft_s(self, request: RouteRequest, replica: ReplicaState) -> float:
        """Wait before prefill starts plus prefill of the part this replica has not cached."""
        return replica.wait_s + self.cost.prefill_s(request.num_tokens, replica.matched_tokens)


def check_param(name: str, value: float, *, low: float = 0.0, strict: bool = False) -> None:
    """Refuse a policy parameter that is not a finite number at or above ``low`` (above, ``strict``).

    Callers pass user input straight through (``--policy-param``, ``spec.router.policyParams``): a
    NaN passes every ``<`` check and makes each score NaN, so finiteness is checked explicitly.
    """
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (strict and value == low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")


def healthy_or_raise(replicas: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
    live = [r for r in replicas if r.healthy]
    if not live:
        raise NoReplicaError("no healthy replica to route to")
    return live


def rendezvous(seed: bytes, replicas: Sequence[ReplicaState]) -> ReplicaState:
    """The replica ranked highest by a hash of ``seed`` with its id (rendezvous hashing): the same
    pick whatever the order ``replicas`` come in, and one joining or leaving moves only the seeds it
    wins or held. ``replicas`` must not be empty."""
    seeded = hashlib.blake2b(seed, digest_size=8)

    def rank(r: ReplicaState) -> bytes:
        h = seeded.copy()
        h.update(str(r.replica_id).encode())
        return h.digest()

    return max(replicas, key=rank)


def tie_break(request: RouteRequest, tied: Sequence[ReplicaState]) -> ReplicaState:
    """One of ``tied`` — replicas equal on everything a policy weighs — chosen by the request's time.

    Gateway replicas share one Redis view and list the replicas in the same order, so "the first of
    the tied" sent every gateway's new prefixes (an idle fleet, equal loads, a prefix nobody holds)
    to one replica. Instead each tied replica is ranked by a hash of its id with the request's
    ``now`` (rendezvous hashing): requests spread evenly, whatever the order the replicas come in,
    and the pick is a pure function of the inputs, so the simulator stays deterministic. Not a hash
    of the prompt: where one tenant's prompts go must not depend on their content, or another
    tenant's routing would (through the load they add) — tests/test_tenancy_secrets.py.
    """
    if len(tied) == 1:
        return tied[0]
    return rendezvous(struct.pack("<d", request.now), tied)


def _first(pair: tuple[Any, ReplicaState]) -> Any:
    return pair[0]


def least(
    request: RouteRequest, replicas: Sequence[ReplicaState], key: Callable[[ReplicaState], Any]
) -> ReplicaState:
    """The replica with the smallest ``key``; several with the same smallest key: :func:`tie_break`."""
    keyed = [(key(r), r) for r in replicas]  # each key once: this runs on every routed request
    lowest, best = min(keyed, key=_first)
    tied = [r for k, r in keyed if k == lowest]
    # a NaN in the key equals nothing (tied can even be empty): keep what min() picked
    return tie_break(request, tied) if len(tied) > 1 else best
