"""Fleet membership for the gateways: which replica pods are routable, at which address (pure).

The operator owns membership (sidecars run with ``--no-self-register``): a replica is a member once
its pod is Ready, with the URL of its sidecar and the routing state the autoscaler gave it
(``prefixfleet.io/state`` annotation: ready | warming | draining; ``draining`` whenever the
reconcile is draining the pod, ``prefixfleet.io/draining-since``). Records are the data plane's
``MemberRecord`` in the ``pf:{fleet}:members`` hash (docs/redis.md). ``plan_membership`` compares
the desired records with what the hash holds and returns the minimal HSET/HDEL.

The records carry no engine facts (``served_models``, ``adapters``, ``engine_api``): the operator
never asks the engine. Each sidecar writes them to its own ``engine:{pod}`` key, which gateways
merge into its record (``records.with_engine``) and the operator never writes, so rewriting a record
here cannot erase them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prefixfleet.router.records import WORKER_STATES, MemberRecord, decode_member, encode_record
from prefixfleet.router.summary import SummaryError

from .models import FleetSpec
from .planner import ObservedPod, pod_url


@dataclass(frozen=True, slots=True)
class MembershipPlan:
    set: Mapping[str, str] = field(default_factory=dict)  # worker id -> encoded MemberRecord
    delete: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        return not self.set and not self.delete


def desired_members(spec: FleetSpec, pods: Sequence[ObservedPod], now: float) -> dict[str, MemberRecord]:
    members = {}
    for pod in pods:
        url = pod_url(pod, spec.sidecar.port)
        if not pod.alive or not pod.ready or url is None:
            continue
        # A pod being drained (draining-since, the reconcile's own mark) is draining whatever its
        # state annotation says: the autoscaler's end of a warm-up removes that annotation, and the
        # reconcile sets draining only once, so a pod drained while it warmed was published ready.
        state = "draining" if pod.draining else pod.state if pod.state in WORKER_STATES else "ready"
        members[pod.name] = MemberRecord(
            url=url,
            state=state,
            model=spec.model.name,
            revision=spec.model.revision,
            adapter=spec.model.adapter or "",
            block_tokens=spec.router.block_tokens,
            registered_at=now,
        )
    return members


def _same(a: MemberRecord, b: MemberRecord) -> bool:
    # registered_at is when it was written, not part of what gateways act on
    return (a.url, a.state, a.model, a.revision, a.adapter, a.block_tokens) == (
        b.url, b.state, b.model, b.revision, b.adapter, b.block_tokens)  # fmt: skip


def plan_membership(
    desired: Mapping[str, MemberRecord], current: Mapping[str, str | bytes]
) -> MembershipPlan:
    to_set = {}
    for wid, record in desired.items():
        raw = current.get(wid)
        try:
            existing = decode_member(raw) if raw is not None else None
        except SummaryError:
            existing = None  # a malformed record is overwritten
        if existing is None or not _same(existing, record):
            to_set[wid] = encode_record(record)
    stale = tuple(sorted(wid for wid in current if wid not in desired))
    return MembershipPlan(to_set, stale)
