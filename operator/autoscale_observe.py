"""What the operator's autoscaler sees of a fleet, as the planner's plain data (pure functions).

The kopf timer (``autoscale_handlers``) gathers three sources per replica pod and hands them here:

* the pod itself (Ready? draining? the ``prefixfleet.io/state`` annotation the autoscaler sets);
* the sidecar's load record from Redis (in flight, queued, pending prefill tokens, prefill speed);
* the engine's cumulative token counters (``sglang:prompt_tokens_total`` and
  ``sglang:cached_tokens_total`` from the sidecar's ``/metrics``): their growth between two rounds is
  the uncached prompt tokens the engine had to prefill, which divided by its prefill speed is the
  replica's *prefill load* (1.0 = it did nothing but prefill). Hits cost nothing there.

Hot subtrees come from the summaries via :func:`~.hot_subtrees.hot_subtrees`. Replicas the spec asks
for but whose pods do not exist yet count as ``starting``: capacity already on its way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router.records import LoadReport

from .autoscale import FleetObservation, ReplicaObservation, ReplicaPhase, ScalePolicy, SubtreeObservation
from .models import FleetSpec
from .planner import ObservedPod

PROMPT_TOKENS = "sglang:prompt_tokens_total"
CACHED_TOKENS = "sglang:cached_tokens_total"
HOT_PREFIXES_IN_STATUS = 8


def scale_policy(spec: FleetSpec) -> ScalePolicy:
    """The planner's knobs from ``spec.autoscaling`` and ``spec.prewarm``."""
    a, p = spec.autoscaling, spec.prewarm
    prewarm = p.enabled and p.top_subtrees > 0
    return ScalePolicy(
        mode="prefix_aware_prewarm" if prewarm else "prefix_aware",
        min_replicas=a.min_replicas,
        max_replicas=a.max_replicas,
        target_ttft_s=a.target_ttft_seconds,
        target_queue_per_replica=a.target_queue_depth,
        scale_up_cooldown_s=float(a.scale_up_cooldown_seconds),
        scale_down_stabilization_s=float(a.scale_down_stabilization_seconds),
        max_step_up=a.max_step_up,
        hot_rate_rps=a.hot_rate_rps,
        prewarm_subtrees=max(p.top_subtrees, 1),
        target_load=a.target_load,
        scale_down_load=a.scale_down_load,
        lead_time_s=a.lead_time_seconds,
    )


@dataclass(frozen=True, slots=True)
class TokenCounters:
    """An engine's cumulative prompt and cached token counters at one instant."""

    at_s: float
    prompt_tokens: float
    cached_tokens: float

    @property
    def uncached_tokens(self) -> float:
        return max(self.prompt_tokens - self.cached_tokens, 0.0)


def parse_token_counters(exposition: str, at_s: float) -> TokenCounters | None:
    """The engine's counters from a Prometheus text exposition (summed over label sets); None if absent."""
    totals = {PROMPT_TOKENS: 0.0, CACHED_TOKENS: 0.0}
    seen = False
    try:
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += float(sample.value)
                    seen = True
    except (ValueError, TypeError):
        return None
    return TokenCounters(at_s, totals[PROMPT_TOKENS], totals[CACHED_TOKENS]) if seen else None


def prefill_load(
    before: TokenCounters | None, now: TokenCounters | None, prefill_tokens_per_s: float
) -> float:
    """Prefill seconds per second between two samples; 0 without two samples or a speed."""
    if before is None or now is None or now.at_s <= before.at_s or prefill_tokens_per_s <= 0:
        return 0.0
    grown = now.uncached_tokens - before.uncached_tokens
    if grown < 0:  # the engine restarted: its counters began again from zero
        grown = now.uncached_tokens
    return grown / (now.at_s - before.at_s) / prefill_tokens_per_s


def replica_phase(pod: ObservedPod, load: LoadReport | None) -> ReplicaPhase:
    if pod.draining or pod.state == "draining":
        return "draining"
    if not pod.ready:
        return "starting"
    if pod.state == "warming" or (load is not None and load.state == "warming"):
        return "warming"
    return "ready"


def _created_s(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").timestamp()
    except ValueError:
        return 0.0


def observe_fleet(
    now: float,
    spec_replicas: int,
    pods: Sequence[ObservedPod],
    loads: Mapping[str, LoadReport],
    prefill_loads: Mapping[str, float],
    subtrees: Sequence[SubtreeObservation],
) -> FleetObservation:
    """The planner's view: one observation per live pod, plus ``starting`` ones for pods still to come."""
    replicas: list[ReplicaObservation] = []
    for pod in pods:
        if not pod.alive:
            continue
        load = loads.get(pod.name)
        phase = replica_phase(pod, load)
        speed = load.prefill_tokens_per_s if load is not None else 0.0
        replicas.append(
            ReplicaObservation(
                replica_id=pod.name,
                phase=phase,
                in_flight=load.in_flight if load else 0,
                queued=load.queued if load else 0,
                est_wait_s=load.pending_prefill_tokens / speed if load and speed > 0 else 0.0,
                cached_tokens=load.cached_tokens if load else 0,
                capacity_tokens=load.capacity_tokens if load else 0,
                created_s=_created_s(pod.created),
                prefill_load=prefill_loads.get(pod.name, 0.0),
            )
        )
    active = sum(1 for r in replicas if r.phase != "draining")
    for i in range(max(spec_replicas - active, 0)):
        replicas.append(ReplicaObservation(replica_id=f"pending-{i}", phase="starting", created_s=now))
    return FleetObservation(now, tuple(replicas), tuple(subtrees))


def hot_prefixes_status(subtrees: Sequence[SubtreeObservation]) -> list[dict[str, Any]]:
    """``status.hotPrefixes``: hashes only (never text), rates rounded so status is not rewritten
    for noise."""
    return [
        {
            "hash": s.subtree_id,
            "tokens": s.tokens,
            "rate": round(s.rate_rps, 1),
            "holders": sorted(s.holders),
        }
        for s in subtrees[:HOT_PREFIXES_IN_STATUS]
    ]


def warm_sources(
    subtree_ids: Sequence[str],
    subtrees: Sequence[SubtreeObservation],
    sidecar_urls: Mapping[str, str],
    exclude: str = "",
) -> dict[str, list[str]]:
    """Group the subtrees to warm by a holder's sidecar URL (the first reachable holder of each)."""
    holders = {s.subtree_id: sorted(s.holders) for s in subtrees}
    out: dict[str, list[str]] = {}
    for sid in subtree_ids:
        source = next(
            (sidecar_urls[h] for h in holders.get(sid, []) if h != exclude and h in sidecar_urls), None
        )
        if source is not None:
            out.setdefault(source, []).append(sid)
    return out
