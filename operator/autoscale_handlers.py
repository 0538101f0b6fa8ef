"""The autoscaler's kopf timer: observe a fleet, ``plan_scale``, execute the plan (the I/O shell).

Every ``spec.autoscaling.intervalSeconds`` per fleet with ``spec.autoscaling.enabled``:

1. observe — replica pods (API server), each sidecar's load record and summary (Redis, decoded with
   the data plane's own code), each engine's token rates and queue (Prometheus when
   ``spec.prometheus.url`` or the operator's ``--prometheus`` is set, else — and whenever Prometheus
   fails or lacks a replica — the sidecar's ``/metrics``; ``status.engineMetrics`` says which, an
   outage is one warning), and merge the summaries into hot subtrees
   (:func:`~.hot_subtrees.hot_subtrees`);
2. plan — :func:`~.autoscale.plan_scale` with the policy from the spec and the memory of the last
   round (kept in memory per fleet and in ``status.autoscaler.memory``: an operator that has none —
   restarted, failed over — restores it from there, so cooldowns and the quiet period survive it;
   see :mod:`.autoscale_memory`);
3. execute —
   * scale up: ``spec.replicas`` through the ``/scale`` subresource (the reconcile handler creates
     the pods); each new pod is marked ``prefixfleet.io/state: warming`` as soon as it exists, and
     once its sidecar answers it gets ``POST /prefixfleet/warm`` with the hot subtrees the plan
     assigned to it and a holder's sidecar as the source (``hold_traffic``: no traffic until warmed),
     carrying the fleet's control token read from its Redis (a sidecar refuses a warm request
     without it; unreadable, the warm-up fails with a Warning ``Prewarmed`` Event); then the mark
     is removed (ready). Unless a ready replica waits past saturation when it arrives
     (:func:`~.autoscale.warm_on_arrival`, on load records read then): it serves at once, cold;
   * pre-warm of an idle existing replica: the same warm request without ``hold_traffic`` and
     without the mark: it keeps serving while it warms (as the simulator models it);
   * scale down: the planner's victim goes into the fleet's ``prefixfleet.io/victims`` annotation and
     ``spec.replicas`` is lowered: the reconcile loop drains exactly that pod, then deletes it;
   * ``status.lastScaleTime``, ``lastScaleReason``, ``hotPrefixes`` (hashes only), an Event with the
     plan's reason, and the operator's Prometheus metrics;
   * ``status.autoscaler.memory`` on a scale (before the scale itself, so a crash in between cannot
     forget it), when a stored quiet period ended, when the stored copy is due a refresh, and along
     with any other status patch (:func:`~.autoscale_memory.memory_due`);
   * ``status.autoscaler.decision`` (the plan's action, what limits it, its reason: why a fleet is
     *not* scaling, :func:`~.autoscale.classify_plan`) when the action or limit changes or the plan
     scales, else along with the memory (:func:`~.autoscale_memory.decision_due`); removed when
     autoscaling is switched off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from redis.exceptions import RedisError

from prefixfleet.router.control import fleet_control_token
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.prewarm import warm_replica

from .autoscale import (
    FleetObservation,
    PlannerMemory,
    ReplicaObservation,
    ScalePlan,
    ScalePolicy,
    SubtreeObservation,
    classify_plan,
    plan_scale,
    warm_on_arrival,
)
from .autoscale_memory import (
    STALE_AFTER_REFRESHES,
    DecisionKey,
    decision_due,
    decision_key,
    decision_since,
    decode_decision,
    decode_memory,
    encode_decision,
    encode_memory,
    memory_due,
    observed_time,
    refresh_period,
)
from .autoscale_observe import (
    EngineRates,
    EngineReading,
    TokenCounters,
    hot_prefixes_status,
    observe_fleet,
    outage_notice,
    scale_policy,
    unavailable_replicas,
    with_unavailable,
)
from .autoscale_sources import read_engine_metrics, read_records, replicas_now
from .handlers import ANNOTATION_VICTIMS, FLEET_RESOURCE, OperatorContext, resolve_redis_url
from .hot_subtrees import HotState, hot_subtrees
from .models import InvalidFleetSpec, validate_spec
from .planner import ANNOTATION_STATE, FleetRef, ObservedPod, observe_pod, pod_url, replica_selector
from .prometheus_source import PrometheusSource, fleet_scope, prometheus_url
from .redis_permissions import redis_error_text

TICK_S = 1.0  # the timer ticks this often; each fleet's round runs every intervalSeconds
SCRAPE_TIMEOUT_S = 2.0
# A new pod may need minutes to be Ready (a node to provision, a large image, a model to load): it
# stays marked warming (it serves nothing yet anyway) and is warmed once its sidecar answers. Before,
# one 180 s deadline from the scale-up covered the start too, and a slower pod was never warmed.
START_TIMEOUT_S = 3600.0
WARM_TIMEOUT_S = 180.0  # for the pod to appear, and then for its warm requests
START_POLL_S = 0.3  # how often a starting pod is read the first 30 s; then every 2 s (minutes to go)
DEFAULT_METRICS_PORT = 8081
ENGINE_SOURCES = ("prometheus", "scrape", "mixed", "none")
SCALE_ACTIONS = ("scale_up", "scale_down", "prewarm", "drain")  # scale_events' action label


class OperatorMetrics:
    """The operator's own series (docs/metrics.md), in a registry owned by the running operator."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("namespace", "fleet")
        self.replicas = Gauge(
            "prefixfleet_operator_replicas", "spec.replicas the operator reconciles to.", labels,
            registry=self.registry,
        )  # fmt: skip
        self.max_replicas = Gauge(
            "prefixfleet_operator_max_replicas",
            "spec.autoscaling.maxReplicas.",
            labels,
            registry=self.registry,
        )
        self.target_ttft = Gauge(
            "prefixfleet_operator_target_ttft_seconds", "spec.autoscaling.targetTTFTSeconds.", labels,
            registry=self.registry,
        )  # fmt: skip
        self.engine_metrics_source = Gauge(
            "prefixfleet_operator_engine_metrics_source",
            "1 for where the autoscaler's last round read engine rates (prometheus, scrape, mixed, none).",
            (*labels, "source"),
            registry=self.registry,
        )
        self.scale_events = Counter(
            "prefixfleet_operator_scale_events",
            "The autoscaler's executed decisions (scale_up, scale_down, prewarm, drain).",
            (*labels, "action"),
            registry=self.registry,
        )
        self.unhealthy_replacements = Counter(
            "prefixfleet_operator_unhealthy_replacements",
            "Replica pods the reconcile deleted for being unready too long (unready, never_ready).",
            (*labels, "reason"),
            registry=self.registry,
        )
        self.unavailable_replicas = Gauge(
            "prefixfleet_operator_unavailable_replicas",
            "Replica pods that served, are unready and that nothing replaces (Degraded ReplicaUnavailable).",
            labels,
            registry=self.registry,
        )

    def forget(self, namespace: str, fleet: str, *, deleted: bool = False) -> None:
        """Drop the autoscaler's gauges of a fleet, and when it is ``deleted`` its scale_events too: a
        fleet still there keeps its count of past scalings, a deleted one's would stay for the
        operator's life (and a fleet created again under the name would go on with it).
        (unavailable_replicas and unhealthy_replacements belong to the reconcile, which runs for every
        fleet: handlers.forget_fleet_series drops them when the fleet goes.)"""
        for gauge in (self.replicas, self.max_replicas, self.target_ttft):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, fleet)
        for source in ENGINE_SOURCES:
            with contextlib.suppress(KeyError):
                self.engine_metrics_source.remove(namespace, fleet, source)
        for action in SCALE_ACTIONS if deleted else ():
            with contextlib.suppress(KeyError):
                self.scale_events.remove(namespace, fleet, action)

    def engine_source(self, namespace: str, fleet: str, used: str) -> None:
        for source in ENGINE_SOURCES:
            self.engine_metrics_source.labels(namespace, fleet, source).set(1 if source == used else 0)


@dataclass
class FleetAutoscale:
    """What the autoscaler remembers about one fleet between rounds."""

    memory: PlannerMemory = field(default_factory=PlannerMemory)
    stored_memory: dict[str, Any] | None = None  # status.autoscaler.memory as last written or restored
    stored_decision: dict[str, Any] | None = None  # status.autoscaler.decision as last written
    decision: DecisionKey | None = None  # the last round's action and limit...
    decision_since: float | None = None  # ...and since when they hold
    hot: HotState | None = None
    counters: dict[str, TokenCounters] = field(default_factory=dict)
    rates: dict[str, EngineRates] = field(default_factory=dict)  # last round's, whatever the source
    metrics_degraded: bool = False  # the configured Prometheus is out: warned once, until it is back
    round_failing: bool = False  # the last round failed (Redis down...): warned once, until one runs
    last_round: float = 0.0
    warming: set[asyncio.Task[None]] = field(default_factory=set)
    warming_pods: set[str] = field(default_factory=set)  # pods (new or existing) a task here is warming
    # the last round's observation, policy and Redis: whether a new pod warms is decided on arrival
    observed: FleetObservation | None = None
    policy: ScalePolicy = field(default_factory=ScalePolicy)
    redis_url: str = ""
    prometheus_url: str = ""  # what the last round read engine rates from ("": none, it scraped)


@dataclass
class AutoscaleContext:
    metrics: OperatorMetrics
    http: httpx.AsyncClient
    fleets: dict[str, FleetAutoscale] = field(default_factory=dict)
    default_prometheus_url: str = ""  # `operator run --prometheus` / PREFIXFLEET_PROMETHEUS_URL
    prometheus: dict[str, PrometheusSource] = field(default_factory=dict)  # one client per URL
    # fleets ("namespace/name") seen not autoscaled whose pods' leftover warming marks this process
    # has cleared -> that fleet's uid: a fleet created again under the name is checked again, even
    # if the old one's deletion (which drops its entry) was never seen
    unmarked: dict[str, str] = field(default_factory=dict)

    def prometheus_source(self, url: str) -> PrometheusSource:
        if url not in self.prometheus:
            self.prometheus[url] = PrometheusSource(url)
        return self.prometheus[url]

    def close_unused_prometheus(self) -> None:
        """Close the clients of the URLs no autoscaled fleet's last round read (the fleet was deleted,
        switched off or pointed elsewhere): kept, each would hold its connections for the operator's
        life. A round still under way on a closed one gets an error and scrapes (its fleet is gone)."""
        used = {state.prometheus_url for state in self.fleets.values()}
        for url in [u for u in self.prometheus if u not in used]:
            self.prometheus.pop(url).close()


@kopf.on.startup()
async def start_autoscaler(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    metrics = OperatorMetrics()
    port = getattr(memo, "metrics_port", DEFAULT_METRICS_PORT)
    if port:
        try:
            start_http_server(port, addr=getattr(memo, "metrics_addr", "0.0.0.0"), registry=metrics.registry)
            logger.info("operator metrics on :%d/metrics", port)
        except OSError as exc:  # metrics are not worth refusing to reconcile
            logger.warning("operator metrics not served: port %d: %s", port, exc)
    if (ctx := getattr(memo, "ctx", None)) is not None:  # the reconcile reports its replicas here
        ctx.unhealthy_replacements = metrics.unhealthy_replacements
        ctx.unavailable_replicas = metrics.unavailable_replicas
    memo.autoscale = AutoscaleContext(
        metrics,
        httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S),
        default_prometheus_url=getattr(memo, "default_prometheus_url", "") or "",
    )


@kopf.on.cleanup()
async def stop_autoscaler(memo: kopf.Memo, **_: Any) -> None:
    auto: AutoscaleContext | None = getattr(memo, "autoscale", None)
    if auto is None:
        return
    for state in auto.fleets.values():
        for task in state.warming:
            task.cancel()
    for source in auto.prometheus.values():
        source.close()
    await auto.http.aclose()


def _autoscaled(spec: Mapping[str, Any], **_: Any) -> bool:
    return bool((spec.get("autoscaling") or {}).get("enabled"))


@kopf.on.event(**FLEET_RESOURCE)
async def autoscale_forget(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A fleet deleted or no longer autoscaled: drop its memory and its metric series (its timer,
    filtered on ``spec.autoscaling.enabled``, no longer runs to do it)."""
    auto: AutoscaleContext | None = getattr(memo, "autoscale", None)
    if auto is None:
        return
    gone = kwargs.get("type") == "DELETED" or bool(body.metadata.get("deletionTimestamp"))
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    key, uid = f"{namespace}/{name}", body.metadata.uid or ""
    if gone or _autoscaled(body.spec):
        # autoscaled: switched off again later, it is checked again then; deleted, autoscaled or not
        # (before, the entry of a fleet deleted while not autoscaled stayed for ever)
        auto.unmarked.pop(key, None)
        if gone:
            _forget_fleet(auto, namespace, name, deleted=True)
        return
    _forget_fleet(auto, namespace, name)
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    if ctx is None:
        return
    stale: dict[str, Any] = {}
    if _stored_decision(body.status):
        stale["autoscaler"] = {"decision": None}
    if (body.status or {}).get("hitRate") is not None:
        stale["hitRate"] = None  # written by the rounds only (fleet_hit_rate)
    if stale:
        # no round runs to keep them current: a decision or hit rate left there would read as
        # today's. (A round that was under way as autoscaling went off may write them again: that
        # patch's event is this handler again, which removes them again.)
        await asyncio.to_thread(ctx.kube.patch_status, "PrefixCacheFleet", namespace, name, stale)
    if auto.unmarked.get(key) != uid:
        # A warming mark left by an operator that died mid warm-up: with no rounds for this fleet
        # nothing else removes it, and the pod would be published as warming (no traffic) for ever.
        # The marks of this process' own warm-ups went with their tasks (_forget_fleet).
        ref = FleetRef(name=name, namespace=namespace, uid=uid)
        for pod in await _list_pods(ctx, ref):
            if pod.state == "warming":
                await _unmark(ctx, namespace, pod.name)
                logger: logging.Logger = kwargs.get("logger") or logging.getLogger(__name__)
                logger.info("pod %s: warming mark of an earlier operator removed (not autoscaled)", pod.name)
        auto.unmarked[key] = uid


def _stored_decision(status: Mapping[str, Any] | None) -> Any:
    return ((status or {}).get("autoscaler") or {}).get("decision")


def _forget_fleet(auto: AutoscaleContext, namespace: str, name: str, *, deleted: bool = False) -> None:
    """Drop a fleet's autoscaler state: cancel its warm tasks, remove its metric series (its count of
    scalings only when it is ``deleted``: OperatorMetrics.forget)."""
    state = auto.fleets.pop(f"{namespace}/{name}", None)
    if state is not None:
        for task in state.warming:
            task.cancel()
        auto.close_unused_prometheus()
    if state is not None or deleted:  # gauges are set only while it has a state; counts outlive it
        auto.metrics.forget(namespace, name, deleted=deleted)


# Only autoscaled fleets tick (every second; each fleet's round runs every intervalSeconds).
@kopf.timer(**FLEET_RESOURCE, interval=TICK_S, sharp=False, when=_autoscaled)
async def autoscale_timer(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    auto: AutoscaleContext | None = getattr(memo, "autoscale", None)
    if ctx is None or auto is None:
        return
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    key = f"{namespace}/{name}"
    raw_spec = dict(body.get("spec") or {})
    if not _autoscaled(raw_spec) or body.metadata.get("deletionTimestamp"):
        _forget_fleet(auto, namespace, name)  # whichever of this and autoscale_forget runs first
        return
    try:
        spec = validate_spec(raw_spec)
    except InvalidFleetSpec:
        return  # the reconcile handler reports it as Degraded
    now = time.time()
    state = auto.fleets.get(key)
    status = dict(body.get("status") or {})
    if state is None or _written_elsewhere(state, status):
        state = auto.fleets[key] = restored_state(
            state, status, now, spec.autoscaling.interval_seconds, logger
        )
    if now - state.last_round < spec.autoscaling.interval_seconds:
        return
    state.last_round = now
    fleet = dict(body)
    ref = FleetRef(name=name, namespace=namespace, uid=body.metadata.uid or "")
    m = auto.metrics
    m.replicas.labels(namespace, name).set(spec.replicas)
    m.max_replicas.labels(namespace, name).set(spec.autoscaling.max_replicas)
    m.target_ttft.labels(namespace, name).set(spec.autoscaling.target_ttft_seconds)
    try:
        await autoscale_round(ctx, auto, state, fleet, ref, spec, logger)
    except (RedisError, OSError, kopf.TemporaryError) as exc:
        # the next round is the retry; an outage is one warning, not one every intervalSeconds
        if not state.round_failing:
            text = redis_error_text(exc)
            logger.warning("autoscaler rounds for %s skipped: %s (warned once, until one runs)", key, text)
        state.round_failing = True
        return
    if state.round_failing:
        logger.info("autoscaler rounds for %s run again", key)
        state.round_failing = False


async def autoscale_round(
    ctx: OperatorContext,
    auto: AutoscaleContext,
    state: FleetAutoscale,
    fleet: dict[str, Any],
    ref: FleetRef,
    spec: Any,
    logger: logging.Logger,
) -> ScalePlan | None:
    namespace, name = ref.namespace, ref.name
    pods = await _list_pods(ctx, ref)
    await _clear_stale_victims(ctx, fleet, pods)
    for pod in pods:
        # marked warming by an operator that died mid-warm: nobody will finish it, put it back
        if pod.state == "warming" and pod.ready and pod.name not in state.warming_pods:
            await _unmark(ctx, namespace, pod.name)
    urls = {p.name: u for p in pods if p.alive and (u := pod_url(p, spec.sidecar.port)) is not None}
    redis_url = await asyncio.to_thread(resolve_redis_url, ctx, namespace, dict(fleet.get("spec") or {}))
    if not redis_url:
        return None  # nothing to observe: the reconcile handler reports the missing Redis
    async with ctx.using_redis(redis_url) as client:  # not closed under the read (handlers.OperatorContext)
        loads, summaries = await read_records(client, FleetKeys(ref.redis_fleet), [p.name for p in pods])
    reading = await _read_engines(
        auto, state, spec, ref, {n: u for n, u in urls.items() if n in loads}, logger
    )
    now = time.time()
    # (a pod whose summary is missing this round keeps its counters: hot_subtrees)
    subtrees, state.hot = hot_subtrees(summaries, state.hot, now, workers={p.name for p in pods})
    # hung pods nothing replaces hold their slots but are no capacity (autoscale_observe)
    unavailable = unavailable_replicas(pods, spec)
    observed = observe_fleet(
        now, spec.replicas, pods, loads, reading.prefill_loads(loads), subtrees, reading.queues(), unavailable
    )
    policy = scale_policy(spec, len(unavailable))
    plan = with_unavailable(plan_scale(observed, policy, state.memory), unavailable)
    state.observed, state.policy, state.redis_url = observed, policy, redis_url
    if plan.add or plan.drain:
        # Observing took a while (Redis, each sidecar's /metrics, Prometheus): a user who raised
        # minReplicas, switched autoscaling off with replicas of their own, or deleted the fleet
        # meanwhile must not be overruled by a plan made from the fleet as it was.
        changed = await asyncio.to_thread(fleet_changed, ctx, fleet)
        if changed:
            logger.info("autoscaler: %s, so this round's plan is not carried out (%s)", changed, plan.reason)
            return None
    status: dict[str, Any] = {}
    memory = encode_memory(plan.memory, now)
    refresh = refresh_period(spec.autoscaling.interval_seconds)
    if (plan.add or plan.drain) and memory_due(state.stored_memory, memory, now, refresh):
        # written before the scale: an operator dying in between must not forget the cooldown (and a
        # failed write leaves the old memory here too: the next round may plan the scale again)
        await _write_memory(ctx, state, namespace, name, memory)
    state.memory = plan.memory
    engine_status = {"source": reading.source, "reason": reading.reason[:1024]}
    if engine_status != (fleet.get("status") or {}).get("engineMetrics"):
        status["engineMetrics"] = engine_status
    hot = hot_prefixes_status(subtrees)
    if hot != ((fleet.get("status") or {}).get("hotPrefixes") or []):
        status["hotPrefixes"] = hot
    # the Hit rate column of kubectl get pcf; unchanged while the replicas answer but have no rate yet
    # (the scrape's first round after a start), removed (None) while the fleet prefills nothing or no
    # engine answers (source none: the last rate would read as today's)
    hit = fleet_hit_rate(reading.rates)
    if (reading.rates or reading.source == "none") and hit != (fleet.get("status") or {}).get("hitRate"):
        status["hitRate"] = hit
    m = auto.metrics
    if plan.add or plan.drain:
        if plan.drain:
            await asyncio.to_thread(
                ctx.kube.annotate,
                "PrefixCacheFleet",
                namespace,
                name,
                {ANNOTATION_VICTIMS: ",".join(plan.drain)},
            )
        await asyncio.to_thread(scale_fleet, ctx, namespace, name, plan.desired_replicas)
        status["lastScaleTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        status["lastScaleReason"] = plan.reason[:1024]
        action = "scale_up" if plan.add else "scale_down"
        m.scale_events.labels(namespace, name, action).inc()
        if plan.drain:
            m.scale_events.labels(namespace, name, "drain").inc(len(plan.drain))
        m.replicas.labels(namespace, name).set(plan.desired_replicas)
        reason = "ScalingUp" if plan.add else "ScalingDown"
        kopf.event(fleet, type="Normal", reason=reason, message=plan.reason)
        logger.info("autoscaler: %s", plan.reason)
    acted = bool(plan.add or plan.drain)
    decided = classify_plan(plan)
    state.decision_since = decision_since(state.decision, state.decision_since, decided, acted, now)
    state.decision = decision_key(decided)
    decision = encode_decision(decided, plan.reason, state.decision_since, now)
    if decision_due(state.stored_decision, decision, acted):
        status["autoscaler"] = {"decision": decision}
    changed = _without_nulls(memory) != state.stored_memory
    if memory_due(state.stored_memory, memory, now, refresh) or (status and changed):
        await _write_memory(ctx, state, namespace, name, memory, also=status, decision=decision)
    elif status:
        await asyncio.to_thread(ctx.kube.patch_status, "PrefixCacheFleet", namespace, name, status)
        if "autoscaler" in status:
            state.stored_decision = _without_nulls(decision)
    if plan.prewarm:
        known = {p.name for p in pods}
        started = 0
        for warm in plan.prewarm:
            if warm.target in state.warming_pods:
                # an existing replica keeps serving while it warms, so the planner asks again for the
                # warm-up under way until it ends: neither a second one nor another Event
                continue
            started += 1
            task = asyncio.create_task(
                prewarm_replica(ctx, auto, state, fleet, ref, spec.sidecar.port, warm.target,
                                warm.subtree_ids, subtrees, known, logger)
            )  # fmt: skip
            state.warming.add(task)
            task.add_done_callback(state.warming.discard)
            task.add_done_callback(functools.partial(log_failed_warm_up, logger, warm.target))
        if started and not plan.add:
            kopf.event(fleet, type="Normal", reason="Prewarming", message=plan.reason)
    return plan


def fleet_hit_rate(rates: Mapping[str, EngineRates]) -> float | None:
    """``status.hitRate``: the share of the replicas' prompt tokens their engines found cached over
    the rate window (token-weighted, as the CRD says), to two places so the status is not rewritten
    for noise; None when no replica prefilled a token. Clamped to [0, 1]: Prometheus extrapolates
    each rate on its own and may put cached above prompt, and the schema refuses the whole status
    patch for a value above 1."""
    prompt = sum(max(r.prompt_tokens_per_s, 0.0) for r in rates.values())
    if prompt <= 0.0:
        return None
    cached = sum(max(r.cached_tokens_per_s, 0.0) for r in rates.values())
    return round(min(cached / prompt, 1.0), 2)


def restored_state(
    state: FleetAutoscale | None,
    status: dict[str, Any],
    now: float,
    interval_s: float,
    logger: logging.Logger,
) -> FleetAutoscale:
    """The fleet's autoscaler state with the planner memory its status holds (warnings logged)."""
    restored = decode_memory(status, now, STALE_AFTER_REFRESHES * refresh_period(interval_s))
    for warning in restored.warnings:
        logger.warning("autoscaler: %s", warning)
    for note in restored.notes:
        logger.info("autoscaler: %s", note)
    state = state or FleetAutoscale()
    state.memory = restored.memory
    state.stored_memory = None  # rewritten on the first round: this operator now owns it
    state.stored_decision = None  # so is the decision; its start is kept if it is still the same
    stored = decode_decision(status)
    state.decision, state.decision_since = (stored[0], min(stored[1], now)) if stored else (None, None)
    if restored.observed_s is not None:
        m = restored.memory
        logger.info(
            "autoscaler: planner memory restored from status (last scale-up %s, last scale-down %s)",
            "none" if m.last_scale_up_s is None else f"{now - m.last_scale_up_s:.0f}s ago",
            "none" if m.last_scale_down_s is None else f"{now - m.last_scale_down_s:.0f}s ago",
        )
    return state


def _written_elsewhere(state: FleetAutoscale, status: dict[str, Any]) -> bool:
    """The status holds a memory newer than this process wrote: another operator ran the fleet
    meanwhile (a failover and back), and its cooldowns are the ones that count."""
    theirs = observed_time(status)
    ours = observed_time({"autoscaler": {"memory": state.stored_memory}}) if state.stored_memory else None
    return theirs is not None and ours is not None and theirs > ours


async def _write_memory(
    ctx: OperatorContext,
    state: FleetAutoscale,
    namespace: str,
    name: str,
    memory: dict[str, Any],
    also: dict[str, Any] | None = None,
    decision: dict[str, Any] | None = None,
) -> None:
    """Write the memory (with ``also``, and the current ``decision``: its reason's counters are
    refreshed at the memory's cadence)."""
    autoscaler = {"memory": memory} if decision is None else {"memory": memory, "decision": decision}
    status = {**(also or {}), "autoscaler": autoscaler}
    await asyncio.to_thread(ctx.kube.patch_status, "PrefixCacheFleet", namespace, name, status)
    state.stored_memory = _without_nulls(memory)
    if decision is not None:
        state.stored_decision = _without_nulls(decision)


def _without_nulls(memory: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in memory.items() if v is not None}  # what the merge patch leaves stored


async def _read_engines(
    auto: AutoscaleContext,
    state: FleetAutoscale,
    spec: Any,
    ref: FleetRef,
    urls: dict[str, str],
    logger: logging.Logger,
) -> EngineReading:
    """This round's engine rates; remembers the scrape samples and logs an outage once."""
    url = prometheus_url(spec.prometheus, auto.default_prometheus_url) or ""
    if state.prometheus_url != url:
        state.prometheus_url = url
        auto.close_unused_prometheus()  # the one it read before, if no other fleet does
    source = auto.prometheus_source(url) if url else None
    scope = fleet_scope(spec.prometheus, ref.namespace, ref.name, spec.engine.kind, spec.engine.args)
    reading = await read_engine_metrics(auto.http, urls, state.counters, source, scope, state.rates)
    state.rates = dict(reading.rates)
    state.counters = dict(reading.counters)
    notice = outage_notice(state.metrics_degraded, reading)
    state.metrics_degraded = reading.degraded
    if notice is not None:
        logger.log(*notice)
    auto.metrics.engine_source(ref.namespace, ref.name, reading.source)
    return reading


async def _clear_stale_victims(
    ctx: OperatorContext, fleet: dict[str, Any], pods: Sequence[ObservedPod]
) -> None:
    """A victim list naming no existing pod has done its job: drop it, so a later pod that reuses the
    name is not preferred for removal."""
    meta = fleet.get("metadata") or {}
    victims = [v for v in (meta.get("annotations") or {}).get(ANNOTATION_VICTIMS, "").split(",") if v]
    if victims and not {p.name for p in pods} & set(victims):
        await asyncio.to_thread(
            ctx.kube.annotate, "PrefixCacheFleet", meta["namespace"], meta["name"], {ANNOTATION_VICTIMS: None}
        )


def fleet_changed(ctx: OperatorContext, fleet: Mapping[str, Any]) -> str:
    """Why the fleet a round planned from is not the one in the API server now ("" when it is): gone,
    being deleted, recreated, or its spec edited (a new ``metadata.generation``; status and
    annotation patches leave it alone)."""
    meta = fleet.get("metadata") or {}
    live = ctx.kube.get("PrefixCacheFleet", meta.get("namespace") or "default", meta.get("name") or "")
    now = (live or {}).get("metadata") or {}
    if live is None:
        return "the fleet was deleted during the round"
    if now.get("deletionTimestamp"):
        return "the fleet is being deleted"
    if now.get("uid") != meta.get("uid"):
        return "the fleet was deleted and created again during the round"
    if now.get("generation") != meta.get("generation"):
        return "the fleet's spec changed during the round"
    return ""


def scale_fleet(ctx: OperatorContext, namespace: str, name: str, replicas: int) -> None:
    """Change spec.replicas through the scale subresource (what an HPA or kubectl scale would do)."""
    kube = ctx.kube
    kube.request(
        "PATCH",
        kube.path("PrefixCacheFleet", namespace, name, "scale"),
        body={"spec": {"replicas": replicas}},
        content_type="application/merge-patch+json",
    )


def log_failed_warm_up(logger: logging.Logger, target: str, task: asyncio.Task[None]) -> None:
    """A warm-up task is nobody's to await: say why it failed (the Kubernetes API, say) instead of
    asyncio's "Task exception was never retrieved". Its pod is back in rotation by then (finally)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.warning("pre-warm of %s failed: %s: %s", target, type(exc).__name__, exc)


async def prewarm_replica(
    ctx: OperatorContext,
    auto: AutoscaleContext,
    state: FleetAutoscale,
    fleet: dict[str, Any],
    ref: FleetRef,
    sidecar_port: int,
    target: str,
    subtree_ids: Sequence[str],
    subtrees: Sequence[SubtreeObservation],
    known: set[str],
    logger: logging.Logger,
) -> None:
    """Warm the target from holders once its sidecar answers. A new pod (``new-<i>``) is marked
    warming as soon as it exists and held out of rotation until warmed, unless it arrives to a
    saturated fleet (:func:`skipped_on_arrival`); an existing one keeps serving while it warms."""
    namespace = ref.namespace
    new = target.startswith("new-")
    pod_name: str | None = None
    try:
        pod_name = await _target_pod(ctx, ref, target, known, time.monotonic() + WARM_TIMEOUT_S)
        if pod_name is None:
            logger.warning("pre-warm of %s: no pod appeared in time", target)
            return
        if pod_name in state.warming_pods:
            # an existing replica keeps serving while it warms, so the next round may plan the same
            # warm-up again before this one ends: one warm-up per pod at a time
            logger.info("pre-warm of %s: already warming", pod_name)
            pod_name = None  # not ours to clean up
            return
        state.warming_pods.add(pod_name)
        if new:  # not serving yet: keep the gateways off it until it is warm
            await asyncio.to_thread(
                ctx.kube.annotate, "Pod", namespace, pod_name, {ANNOTATION_STATE: "warming"}
            )
        wait_s = START_TIMEOUT_S if new else WARM_TIMEOUT_S  # an existing pod is up already
        up_by = time.monotonic() + wait_s
        url, urls = await _wait_sidecar(ctx, auto.http, ref, pod_name, sidecar_port, up_by)
        if url is None:
            logger.warning("pre-warm of %s: the pod is gone, or not serving within %.0f s", pod_name, wait_s)
            return
        if new and await skipped_on_arrival(ctx, state, fleet, ref, pod_name):
            return
        try:
            token = await _control_token(ctx, state, ref)
        except (RedisError, OSError) as exc:
            # a sidecar refuses a warm request without the fleet's token: said as a failed warm-up
            why = f"cannot read the fleet's control token from Redis: {redis_error_text(exc)}"
            logger.warning("pre-warm of %s failed: %s", pod_name, why)
            message = f"pod {pod_name}: 0 hot prefix(es) warmed, {len(set(subtree_ids))} failed ({why})"
            kopf.event(fleet, type="Warning", reason="Prewarmed", message=message)
            return
        deadline = time.monotonic() + WARM_TIMEOUT_S  # the warm requests' own budget
        outcome = await warm_replica(
            auto.http,
            url,
            subtree_ids,
            subtrees,
            urls,
            exclude=pod_name,
            hold_traffic=new,
            timeout_s=lambda: max(deadline - time.monotonic(), 1.0),  # what is left of the deadline
            control_token=token,
        )
        for source, error in outcome.errors:
            logger.warning("pre-warm of %s from %s failed: %s", pod_name, source, error)
        auto.metrics.scale_events.labels(namespace, ref.name, "prewarm").inc()
        # a subtree no ready pod holds any more (its holder hung, drained or gone) had nothing to copy
        # from: not warmed either (before, "0 of 0 hot prefix(es) warmed, 0 failed", a Normal Event)
        unsourced = max(len(set(subtree_ids)) - outcome.ok - outcome.failed, 0)
        failed = outcome.failed + unsourced
        kopf.event(
            fleet,
            type="Normal" if not failed else "Warning",
            reason="Prewarmed",
            message=(
                f"pod {pod_name}: {outcome.warmed_tokens} tokens of {outcome.ok} hot prefix(es) warmed, "
                f"{failed} failed"
                + (f" ({unsourced} with no ready holder to copy from)" if unsourced else "")
            ),
        )
    finally:
        if pod_name is not None:
            state.warming_pods.discard(pod_name)
        if new and pod_name is not None:  # never leave a replica out of rotation
            with contextlib.suppress(Exception):
                await _unmark(ctx, namespace, pod_name)


async def skipped_on_arrival(
    ctx: OperatorContext, state: FleetAutoscale, fleet: dict[str, Any], ref: FleetRef, pod_name: str
) -> bool:
    """Whether the new pod ``pod_name`` skips its planned warm-up because the fleet is queueing for
    it (:func:`~.autoscale.warm_on_arrival` on the load records read now); Event ``PrewarmSkipped``
    when it does. The caller then removes its warming mark: it serves at once, cold."""
    if warm_on_arrival(await _arrived_to(ctx, state, ref), state.policy):
        return False
    kopf.event(
        fleet,
        type="Normal",
        reason="PrewarmSkipped",
        message=f"pod {pod_name}: a ready replica waits past saturation, so it serves at once, cold",
    )
    return True


async def _arrived_to(
    ctx: OperatorContext, state: FleetAutoscale, ref: FleetRef
) -> Sequence[ReplicaObservation]:
    """The replicas as a new pod arrives (:func:`~.autoscale_sources.replicas_now`)."""
    last = state.observed
    if not state.redis_url:
        return last.replicas if last is not None else ()
    pods = await _list_pods(ctx, ref)
    async with ctx.using_redis(state.redis_url) as client:
        return await replicas_now(client, FleetKeys(ref.redis_fleet), pods, last)


async def _control_token(ctx: OperatorContext, state: FleetAutoscale, ref: FleetRef) -> str:
    """The fleet's control token (:mod:`prefixfleet.router.control`), which a sidecar's control routes
    require, read from the fleet's Redis with the operator's client of the last round's URL. Read at
    each warm-up, not kept: a rotation (``DEL pf:{fleet}:control``) holds for the next one."""
    if not state.redis_url:
        raise RedisError("no Redis URL known for the fleet yet")
    async with ctx.using_redis(state.redis_url) as client:
        return await fleet_control_token(client, FleetKeys(ref.redis_fleet))


async def _unmark(ctx: OperatorContext, namespace: str, pod_name: str) -> None:
    """Remove a pod's warming mark: membership publishes it as ready (a vanished pod is fine)."""
    await asyncio.to_thread(ctx.kube.annotate, "Pod", namespace, pod_name, {ANNOTATION_STATE: None})


async def _list_pods(ctx: OperatorContext, ref: FleetRef) -> list[ObservedPod]:
    return await asyncio.to_thread(
        lambda: [observe_pod(p) for p in ctx.kube.list("Pod", ref.namespace, replica_selector(ref))]
    )


async def _target_pod(
    ctx: OperatorContext, ref: FleetRef, target: str, known: set[str], deadline: float
) -> str | None:
    """The pod a prewarm target names: an existing pod, or the i-th pod created after the plan."""
    if not target.startswith("new-"):
        return target
    index = int(target[len("new-") :])
    while time.monotonic() < deadline:
        new = sorted((p for p in await _list_pods(ctx, ref) if p.alive and p.name not in known),
                     key=_creation_order)  # fmt: skip
        if len(new) > index:
            return new[index].name
        await asyncio.sleep(0.2)
    return None


def _creation_order(pod: ObservedPod) -> tuple[str, int, str]:
    """The order the reconcile created replica pods in: by creation time, which has one-second
    resolution, then by replica index (it creates the missing indexes in ascending order). By name
    as text, ``x-replica-10`` came before ``x-replica-9``: a ``new-1`` resolved after ``new-0`` had
    taken replica-9 named replica-9 again, and replica-10 was never held out of rotation nor warmed."""
    index = pod.name.rpartition("-")[2]
    return pod.created, int(index) if index.isascii() and index.isdigit() else -1, pod.name


async def _wait_sidecar(
    ctx: OperatorContext, http: httpx.AsyncClient, ref: FleetRef, pod_name: str, port: int, deadline: float
) -> tuple[str | None, dict[str, str]]:
    """The pod's sidecar URL once the pod is Ready and its engine answers, with every ready pod's URL;
    (None, ...) when the pod is gone or the deadline passed."""
    slower_after = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        pods = await _list_pods(ctx, ref)
        urls = {p.name: u for p in pods if p.ready and not p.draining and (u := pod_url(p, port)) is not None}
        if pod_name not in {p.name for p in pods}:
            return None, urls
        url = urls.get(pod_name)
        if url is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await http.get(f"{url}/prefixfleet/status")
                if resp.status_code == 200 and resp.json().get("engine_ok"):
                    return url, urls
        await asyncio.sleep(START_POLL_S if time.monotonic() < slower_after else 2.0)
    return None, {}
