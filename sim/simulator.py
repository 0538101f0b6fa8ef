"""Discrete-event loop: arrivals are routed by a real policy onto simulated replicas.

The loop owns time. Before an arrival at ``t`` it lets every replica process its internal events due
at or before ``t`` (engine steps, for the batched model), then builds one
:class:`~prefixfleet.router.policies.ReplicaState` per replica, asks the policy, tells it what was
routed, and hands the request to the chosen replica. Policies see only those views.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from prefixfleet.router.policies import RouteRequest, RoutingPolicy
from prefixfleet.router.radix import RadixTree

from .engine import Job, ReplicaModel, ServiceConfig, make_replica
from .workloads import WorkloadRequest


@dataclass(frozen=True, slots=True)
class FleetConfig:
    replicas: int
    cache_tokens: int
    service: ServiceConfig = field(default_factory=ServiceConfig)

    def __post_init__(self) -> None:
        if self.replicas <= 0:
            raise ValueError(f"replicas must be positive, got {self.replicas}")
        if self.cache_tokens <= 0:
            raise ValueError(f"cache_tokens must be positive, got {self.cache_tokens}")


@dataclass(slots=True)
class RunResult:
    """Raw outcome of one simulated run, one entry per request in arrival order."""

    name: str
    ttft_s: list[float]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    replica: list[int]
    groups: list[str]
    replicas: int
    evicted_tokens: int = 0
    decisions: dict[str, int] = field(default_factory=dict)  # Decision.reason -> count


def _drain_until(replicas: Sequence[ReplicaModel], t: float) -> None:
    """Process every replica event due at or before ``t``, in time order."""
    while True:
        best: ReplicaModel | None = None
        best_t = t
        for rep in replicas:
            ev = rep.next_event_s()
            if ev is not None and ev <= best_t:
                best, best_t = rep, ev
        if best is None:
            return
        best.on_event(best_t)


def simulate(
    requests: Sequence[WorkloadRequest],
    policy: RoutingPolicy | Sequence[RoutingPolicy],
    fleet: FleetConfig,
    *,
    progress: bool | None = None,
    replicas: Sequence[ReplicaModel] | None = None,
) -> RunResult:
    """Route ``requests`` with ``policy`` over a fresh fleet and serve them; returns per-request results.

    A sequence of policy instances models that many gateways, each with its own routing state (an
    SGLang router replica's tree, queue_aware's arrival rates): request ``i`` goes through gateway
    ``i % len(policy)``, as a client alternating between gateway replicas sends it. ``replicas``:
    unused replica models to serve on (built from ``fleet`` when omitted), e.g. ones that carry
    what their sidecars measured in an earlier run; the caller can read them afterwards.
    """
    routers = [policy] if isinstance(policy, RoutingPolicy) else list(policy)
    if not routers:
        raise ValueError("simulate needs at least one policy instance")
    policy = routers[0]
    if replicas is None:
        replicas = [make_replica(i, fleet.cache_tokens, fleet.service) for i in range(fleet.replicas)]
    elif len(replicas) != fleet.replicas or any(r.routed for r in replicas):
        raise ValueError(f"simulate needs {fleet.replicas} unused replicas, got {len(replicas)}")
    by_id = {r.replica_id: r for r in replicas}
    jobs = [Job(i, r.arrival_s, r.tokens, r.output_tokens) for i, r in enumerate(requests)]
    decisions: dict[str, int] = {}
    bar = tqdm(
        total=len(jobs),
        desc=f"sim {policy.name}",
        unit="req",
        file=sys.stderr,
        disable=(not progress) if progress is not None else None,
        leave=False,
    )
    with bar:
        for i, (job, req) in enumerate(zip(jobs, requests, strict=True)):
            now = req.arrival_s
            _drain_until(replicas, now)
            route = RouteRequest(
                tokens=req.tokens, num_tokens=job.total, now=now, max_new_tokens=req.output_tokens
            )
            gateway = i % len(routers)
            views = [rep.view(route, gateway) for rep in replicas]
            router = routers[gateway]
            decision = router.choose(route, views)
            chosen = by_id.get(decision.replica_id)  # type: ignore[arg-type]
            if chosen is None:
                raise RuntimeError(f"policy {router.name} chose unknown replica {decision.replica_id!r}")
            router.on_routed(route, decision)
            decisions[decision.reason] = decisions.get(decision.reason, 0) + 1
            job.replica = chosen.replica_id
            job.est_uncached = job.total - views[replicas.index(chosen)].matched_tokens
            chosen.accept(job, now, gateway)
            if i % 256 == 255:
                bar.update(256)
        _drain_until(replicas, math.inf)
        bar.update(len(jobs) % 256)
    unserved = [j.index for j in jobs if math.isnan(j.ttft_s)]
    if unserved:  # a bug in a service model, never a property of the workload
        raise RuntimeError(f"{len(unserved)} requests never got a first token (first: #{unserved[0]})")
    return RunResult(
        name=policy.name,
        ttft_s=[j.ttft_s for j in jobs],
        prompt_tokens=[j.total for j in jobs],
        cached_tokens=[j.matched for j in jobs],
        replica=[j.replica for j in jobs],
        groups=[r.group for r in requests],
        replicas=fleet.replicas,
        evicted_tokens=sum(r.tree.evicted_tokens_total for r in replicas),
        decisions=decisions,
    )


def simulate_ideal(requests: Sequence[WorkloadRequest], fleet: FleetConfig) -> RunResult:
    """The bound no policy beats: no waiting, and a hit on everything any earlier request prefilled.

    One fleet-wide cache of unlimited size; each request's TTFT is its unloaded prefill time for the
    part no earlier request covered.
    """
    total = sum(len(r.tokens) for r in requests) // 4 + 1
    tree = RadixTree(total)
    ttft, prompt, cached = [], [], []
    for req in requests:
        n = req.num_tokens
        matched = tree.insert(req.tokens).matched_tokens
        ttft.append(fleet.service.unloaded_ttft_s(n, matched))
        prompt.append(n)
        cached.append(matched)
    return RunResult(
        name="ideal",
        ttft_s=ttft,
        prompt_tokens=prompt,
        cached_tokens=cached,
        replica=[-1] * len(requests),
        groups=[r.group for r in requests],
        replicas=fleet.replicas,
    )
