"""What the operator's autoscaler sees of a fleet, as the planner's plain data (pure functions).

The kopf timer (``autoscale_handlers``) gathers three sources per replica pod and hands them here:

* the pod itself (Ready? draining? the ``prefixfleet.io/state`` annotation the autoscaler sets);
* the sidecar's load record from Redis (in flight, queued, pending prefill tokens, prefill speed);
* the engine's token rates (:class:`EngineRates`): from Prometheus (``rate()`` of
  ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total``, or vLLM's prefix-cache query and
  hit counters, by the API the engine speaks: :func:`engine_metric_names`; see :mod:`.prometheus_source`) or,
  without Prometheus or when it fails, from the growth of those counters on the sidecar's ``/metrics``
  between two rounds. Prompt minus cached tokens per second is what the engine had to prefill, which
  divided by its prefill speed is the replica's *prefill load* (1.0 = it did nothing but prefill).
  Hits cost nothing there. :func:`engine_reading` merges the two sources and says which was used.

Hot subtrees come from the summaries via :func:`~.hot_subtrees.hot_subtrees`. Replicas the spec asks
for but whose pods do not exist yet count as ``starting``: capacity already on its way.

A pod that served and is unready now (:attr:`~.planner.ObservedPod.lapsed`: a hung engine, or one the
kubelet restarted) is not observed at all: it serves nothing, its cache is out of reach (so the hot
subtrees it held are starved, not "help on its way"), and its load record is stale. Its *slot* in
``spec.replicas`` is observed as ``starting`` like any other missing pod: that is its replacement,
which the reconcile creates (``spec.engine.replaceUnreadyAfterSeconds``). Leaving the slot out as
well would make the planner's replica count one short of ``spec.replicas``, and every scale it
planned (``desired = observed + add``) would come out one too small.

Unless no replacement is coming (:func:`unavailable_replicas`: ``replaceUnreadyAfterSeconds: 0``, or
an unready time no allowance can be counted from): then the slot is no capacity either, and counted
as ``starting`` it would be "on its way" for ever, so the fleet would stay one replica short and
never scale down (the planner waits for starting replicas). Such a pod is *unavailable*: the planner
plans the rest of the fleet (:func:`observe_fleet` leaves out the pod and its slot, and
:func:`scale_policy` lowers maxReplicas by the pods it holds: they are pods, and cost their GPUs),
and :func:`with_unavailable` adds their slots back to the plan's ``spec.replicas``. So the fleet
scales up to make up for them within minReplicas and maxReplicas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router.records import LoadReport

from .autoscale import (
    FleetObservation,
    ReplicaObservation,
    ReplicaPhase,
    ScalePlan,
    ScalePolicy,
    SubtreeObservation,
)
from .models import ENGINE_KINDS, HOT_PREFIX_HOLDERS_MAX, EngineKind, FleetSpec
from .planner import ObservedPod, sidecar_engine_api, stays_unavailable


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """The engine's own series the autoscaler reads: two token counters (prompt tokens it was asked
    for, and of those the ones its prefix cache served) and its queue-length gauge."""

    prompt_tokens: str
    cached_tokens: str
    queue_reqs: str


SGLANG_METRICS = EngineMetricNames(
    "sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:num_queue_reqs"
)
# vLLM (V1 engine) counts its prefix cache in tokens: queries = prompt tokens looked up, hits = the
# ones found cached. Without them (prefix caching off, or vLLM's metrics absent) there are no rates
# and the replica's prefill load reads 0, as for any engine that exports nothing.
VLLM_METRICS = EngineMetricNames(
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_requests_waiting"
)
# By the API the engine speaks (planner.sidecar_engine_api), not by its kind: an emulator run with
# --api vllm exports vLLM's series, not SGLang's.
ENGINE_API_METRICS: dict[str, EngineMetricNames] = {"sglang": SGLANG_METRICS, "vllm": VLLM_METRICS}


def engine_metric_names(kind: EngineKind, args: Sequence[str] = ()) -> EngineMetricNames:
    """The series an engine of ``kind`` run with ``args`` (spec.engine.args) exports: those of the
    API it speaks, as the one decision of it (:func:`~.planner.sidecar_engine_api`) has it."""
    return ENGINE_API_METRICS[sidecar_engine_api(kind, args)]


# each kind's series with no args (an emulator's default API is SGLang's)
ENGINE_METRICS: dict[EngineKind, EngineMetricNames] = {k: engine_metric_names(k) for k in ENGINE_KINDS}
HOT_PREFIXES_IN_STATUS = 8


def scale_policy(spec: FleetSpec, unavailable: int = 0) -> ScalePolicy:
    """The planner's knobs from ``spec.autoscaling`` and ``spec.prewarm``, for the fleet without its
    ``unavailable`` pods (see the module docs): they count against maxReplicas, not minReplicas, which
    is the least the fleet should have serving."""
    a, p = spec.autoscaling, spec.prewarm
    prewarm = p.enabled and p.top_subtrees > 0
    most = max(a.max_replicas - unavailable, 0)
    return ScalePolicy(
        mode="prefix_aware_prewarm" if prewarm else "prefix_aware",
        min_replicas=min(a.min_replicas, most),
        max_replicas=most,
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
    """An engine's cumulative prompt and cached token counters (and its queue) at one instant."""

    at_s: float
    prompt_tokens: float
    cached_tokens: float
    queue_reqs: float | None = None

    @property
    def uncached_tokens(self) -> float:
        return max(self.prompt_tokens - self.cached_tokens, 0.0)


@dataclass(frozen=True, slots=True)
class EngineRates:
    """An engine's prompt and cached tokens per second over the last window, and its queue."""

    prompt_tokens_per_s: float
    cached_tokens_per_s: float
    queue_reqs: float | None = None

    @property
    def uncached_tokens_per_s(self) -> float:
        return max(self.prompt_tokens_per_s - self.cached_tokens_per_s, 0.0)


def parse_token_counters(
    exposition: str, at_s: float, names: EngineMetricNames = SGLANG_METRICS
) -> TokenCounters | None:
    """The engine's counters from a Prometheus text exposition (summed over label sets); None if absent."""
    totals = {names.prompt_tokens: 0.0, names.cached_tokens: 0.0}
    queue: float | None = None
    seen = False
    try:
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                # A non-finite value is no reading (as Prometheus' are dropped): a NaN reached int()
                # and math.ceil() downstream and every round raised ValueError. A counter's makes
                # the whole sample none: read as 0 it would look like an engine restart, then a spike.
                finite = math.isfinite(sample.value)
                if sample.name in totals:
                    if not finite:
                        return None
                    totals[sample.name] += float(sample.value)
                    seen = True
                elif sample.name == names.queue_reqs and finite:
                    queue = (queue or 0.0) + float(sample.value)
    except (ValueError, TypeError):
        return None
    if not seen:
        return None
    return TokenCounters(at_s, totals[names.prompt_tokens], totals[names.cached_tokens], queue)


def rates_between(before: TokenCounters | None, now: TokenCounters | None) -> EngineRates | None:
    """Rates from two samples of the counters; None without two samples in order."""
    if before is None or now is None or now.at_s <= before.at_s:
        return None
    prompt = now.prompt_tokens - before.prompt_tokens
    cached = now.cached_tokens - before.cached_tokens
    if prompt < 0 or cached < 0:  # the engine restarted: its counters began again from zero
        prompt, cached = now.prompt_tokens, now.cached_tokens
    seconds = now.at_s - before.at_s
    return EngineRates(prompt / seconds, cached / seconds, now.queue_reqs)


def prefill_load_of(rates: EngineRates | None, prefill_tokens_per_s: float) -> float:
    """Prefill seconds per second; 0 without rates or a speed."""
    if rates is None or prefill_tokens_per_s <= 0:
        return 0.0
    return rates.uncached_tokens_per_s / prefill_tokens_per_s


EngineSource = Literal["prometheus", "scrape", "mixed", "none"]


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One round's engine rates per replica, the scrape samples to keep for the next round, and
    where the rates came from (``status.engineMetrics``). ``degraded``: a configured Prometheus was
    unavailable or had no series of the fleet at all (an outage, worth one warning)."""

    rates: Mapping[str, EngineRates]
    counters: Mapping[str, TokenCounters]
    source: EngineSource
    reason: str
    degraded: bool = False

    def prefill_loads(self, loads: Mapping[str, LoadReport]) -> dict[str, float]:
        return {
            n: prefill_load_of(r, loads[n].prefill_tokens_per_s) for n, r in self.rates.items() if n in loads
        }

    def queues(self) -> dict[str, float]:
        return {n: r.queue_reqs for n, r in self.rates.items() if r.queue_reqs is not None}


def _names(names: Sequence[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def engine_reading(
    names: Sequence[str],
    previous: Mapping[str, TokenCounters],
    scraped: Mapping[str, TokenCounters],
    *,
    prometheus_url: str | None = None,
    prometheus_rates: Mapping[str, EngineRates] | None = None,
    prometheus_problem: str = "",
    last_rates: Mapping[str, EngineRates] | None = None,
) -> EngineReading:
    """Merge Prometheus' rates (preferred) with the rates of scraped counters for the other replicas.

    ``scraped`` holds this round's scrape of the replicas Prometheus did not cover, ``previous`` the
    last round's. A replica scraped for the first time has no rate from it yet: it keeps its rate of
    the last round (``last_rates``, e.g. Prometheus' before an outage) for this one round rather than
    reading as idle; without one (a new pod, an operator restart) it has none.
    """
    from_prometheus = {n: prometheus_rates[n] for n in names if prometheus_rates and n in prometheus_rates}
    rates: dict[str, EngineRates] = dict(from_prometheus)
    for n in names:
        if n in rates or n not in scraped:
            continue
        if n in previous:
            if (r := rates_between(previous[n], scraped[n])) is not None:
                rates[n] = r
        elif last_rates and n in last_rates:  # bounded: next round it has a previous sample
            rates[n] = last_rates[n]
    counters = {n: c for n, c in scraped.items() if n in names and n not in from_prometheus}
    fallback_source: EngineSource = "scrape" if counters else "none"
    if prometheus_url is None:
        reason = "no Prometheus configured (spec.prometheus.url): each sidecar's /metrics"
        return EngineReading(rates, counters, fallback_source, reason)
    if prometheus_problem:
        reason = f"Prometheus {prometheus_url} unavailable ({prometheus_problem}): each sidecar's /metrics"
        return EngineReading(rates, counters, fallback_source, reason, degraded=True)
    missing = [n for n in names if n not in from_prometheus]
    if not missing:
        return EngineReading(
            rates, counters, "prometheus", f"Prometheus {prometheus_url}: {len(names)} replica(s)"
        )
    if not from_prometheus:
        reason = (
            f"Prometheus {prometheus_url} has no engine series of this fleet (spec.prometheus.matchLabels,"
            " podLabel; or not scraped yet): each sidecar's /metrics"
        )
        return EngineReading(rates, counters, fallback_source, reason, degraded=True)
    reason = (
        f"Prometheus {prometheus_url}: {len(from_prometheus)} replica(s); no series yet for"
        f" {_names(missing)}: their sidecar's /metrics"
    )
    return EngineReading(rates, counters, "mixed", reason)


def outage_notice(was_degraded: bool, reading: EngineReading) -> tuple[int, str] | None:
    """(log level, message) when an outage of the configured Prometheus begins or ends; None
    otherwise, so a long outage is one warning, not one per round."""
    if reading.degraded and not was_degraded:
        return logging.WARNING, f"engine metrics: {reading.reason} (warned once until it recovers)"
    if was_degraded and not reading.degraded:
        return logging.INFO, f"engine metrics: recovered: {reading.reason}"
    return None


def unavailable_replicas(pods: Sequence[ObservedPod], spec: FleetSpec) -> tuple[str, ...]:
    """Pods that served, are unready now, and that nothing brings back: no knob replaces them
    (``spec.engine.replaceUnreadyAfterSeconds: 0``, or no readable unready time) and the kubelet is
    not restarting their engine. They are no capacity, and none is on its way for them."""
    unready_after_s = spec.engine.replace_unready_after_seconds
    never_ready_after_s = spec.engine.replace_never_ready_after_seconds
    return tuple(p.name for p in pods if stays_unavailable(p, unready_after_s, never_ready_after_s))


def with_unavailable(plan: ScalePlan, unavailable: Sequence[str]) -> ScalePlan:
    """``plan``, made for the fleet without its unavailable pods, in ``spec.replicas`` terms: they
    keep their slots (the reconcile counts every pod), so the scale adds them back."""
    if not unavailable:
        return plan
    return replace(
        plan,
        desired_replicas=plan.desired_replicas + len(unavailable),
        reason=f"{plan.reason}; not counted as capacity, no replacement coming:"
        f" {_names(sorted(unavailable))} (served, unready now)",
    )


def replica_phase(pod: ObservedPod, load: LoadReport | None) -> ReplicaPhase:
    """``starting`` is a pod not Ready yet; one that served and is unready now is not observed at
    all (:func:`observe_fleet`)."""
    if pod.draining or pod.state == "draining":
        return "draining"
    if not pod.ready:
        return "starting"
    if pod.state == "warming" or (load is not None and load.state == "warming"):
        return "warming"
    return "ready"


def _created_s(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def observe_fleet(
    now: float,
    spec_replicas: int,
    pods: Sequence[ObservedPod],
    loads: Mapping[str, LoadReport],
    prefill_loads: Mapping[str, float],
    subtrees: Sequence[SubtreeObservation],
    engine_queues: Mapping[str, float] | None = None,
    unavailable: Collection[str] = (),
) -> FleetObservation:
    """The planner's view: one observation per live pod that has not lapsed (see the module docs),
    plus ``starting`` ones for the replicas still to come (including lapsed pods' replacements, but
    not the slots of ``unavailable`` pods: :func:`unavailable_replicas`).

    ``engine_queues`` (the engines' ``sglang:num_queue_reqs``) raise a replica's ``queued`` when the
    engine reports more waiting requests than its sidecar's record (which counts every request not
    yet past prefill, so it is usually the larger)."""
    replicas: list[ReplicaObservation] = []
    for pod in pods:
        if not pod.alive or pod.lapsed:
            continue
        load = loads.get(pod.name)
        phase = replica_phase(pod, load)
        speed = load.prefill_tokens_per_s if load is not None else 0.0
        replicas.append(
            ReplicaObservation(
                replica_id=pod.name,
                phase=phase,
                in_flight=load.in_flight if load else 0,
                queued=max(load.queued if load else 0, int((engine_queues or {}).get(pod.name, 0))),
                est_wait_s=load.pending_prefill_tokens / speed if load and speed > 0 else 0.0,
                cached_tokens=load.cached_tokens if load else 0,
                capacity_tokens=load.capacity_tokens if load else 0,
                created_s=_created_s(pod.created),
                prefill_load=prefill_loads.get(pod.name, 0.0),
            )
        )
    active = sum(1 for r in replicas if r.phase != "draining")
    held = sum(1 for p in pods if p.name in unavailable and p.lapsed)
    for i in range(max(spec_replicas - held - active, 0)):
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
            # the CRD's cap: beyond it the API server refuses the round's whole status patch
            "holders": sorted(s.holders)[:HOT_PREFIX_HOLDERS_MAX],
        }
        for s in subtrees[:HOT_PREFIXES_IN_STATUS]
    ]
