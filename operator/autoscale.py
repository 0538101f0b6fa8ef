"""The autoscaling plan: scale and pre-warm for hot prefix subtrees, remove the least valuable replica.

``plan_scale(observed, policy, memory) -> ScalePlan`` is a pure function over plain data. The
simulator, the local fleet and the kopf timer all build a :class:`FleetObservation` from their own
sources (simulated trees, Redis summaries, Prometheus) and execute the returned plan.

Why prefix-aware: a fleet-wide average (what an HPA on queue depth sees) hides a hot subtree whose
few holders are drowning while the rest idle. Adding a cold replica does not help that subtree until
the router moves its traffic there, and the first requests it gets are full-price prefills. So the
planner (1) looks at each hot subtree's holders, (2) first replicates the subtree onto an idle
existing replica, (3) scales up only when none is idle, pre-warming the new replica with exactly the
subtrees it is added for, and (4) on scale-down removes the replica whose cache is worth least:
the prefixes only it holds × their request rate × what they cost to recompute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel

from .models import AutoscalingSpec, PrewarmSpec, ScalingAction, ScalingLimit

ReplicaPhase = Literal["starting", "warming", "ready", "draining"]
ScalerMode = Literal["fixed_max", "uniform", "prefix_aware", "prefix_aware_prewarm"]
SCALER_MODES: tuple[str, ...] = ("fixed_max", "uniform", "prefix_aware", "prefix_aware_prewarm")
# The demand trend's time constant is lead_time / TREND_STEPS: a ramp is followed well within one
# start-up time, and one round's noise moves it little (lead_time / 2 was measurably late on viral).
TREND_STEPS = 3.0


@dataclass(frozen=True, slots=True)
class ReplicaObservation:
    replica_id: str
    phase: ReplicaPhase
    in_flight: int = 0
    queued: int = 0
    est_wait_s: float = 0.0  # how long a request arriving now would wait before its prefill starts
    cached_tokens: int = 0
    capacity_tokens: int = 0
    created_s: float = 0.0
    # Prefill seconds per second recently asked of this engine: uncached prompt tokens/s × prefill
    # cost (sidecar counters, or rate(prompt_tokens_total - cached_tokens_total) from Prometheus).
    # 1.0 = it would do nothing but prefill. Hits cost nothing here: a warm cache is capacity.
    prefill_load: float = 0.0


@dataclass(frozen=True, slots=True)
class SubtreeObservation:
    """A hot prefix subtree of the fleet view (see ``hot_subtrees``)."""

    subtree_id: str  # hash of the prefix at the subtree's root: never raw text
    tokens: int  # prefix length at the root
    rate_rps: float  # decayed request rate through the root
    holders: frozenset[str]  # replicas that have the root cached


@dataclass(frozen=True, slots=True)
class FleetObservation:
    now_s: float
    replicas: tuple[ReplicaObservation, ...]
    subtrees: tuple[SubtreeObservation, ...] = ()


def _spec_default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


_A, _P = AutoscalingSpec, PrewarmSpec


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    """The planner's knobs. A knob the PrefixCacheFleet spec has takes its default from the spec's
    model (one source of truth; ``autoscale_observe.scale_policy`` maps a spec); the others are
    the planner's own. The simulator and the local fleet set the timers they compress explicitly.
    """

    mode: ScalerMode = "prefix_aware_prewarm"
    min_replicas: int = _spec_default(_A, "min_replicas")
    max_replicas: int = _spec_default(_A, "max_replicas")
    target_ttft_s: float = _spec_default(_A, "target_ttft_seconds")
    # uniform mode: like an HPA on sglang:num_queue_reqs
    target_queue_per_replica: float = _spec_default(_A, "target_queue_depth")
    scale_up_cooldown_s: float = float(_spec_default(_A, "scale_up_cooldown_seconds"))
    scale_down_stabilization_s: float = float(_spec_default(_A, "scale_down_stabilization_seconds"))
    max_step_up: int = _spec_default(_A, "max_step_up")
    hot_rate_rps: float = _spec_default(_A, "hot_rate_rps")  # subtrees below this are not worth a replica
    saturation: float = 0.7  # holders are saturated when their best wait exceeds this × target
    idle: float = 0.2  # a replica is idle below this × target wait
    prewarm_subtrees: int = _spec_default(_P, "top_subtrees")  # subtrees pre-warmed per replica
    prefill_s_per_token: float = 0.0000333
    # prefix-aware modes: keep the fleet's prefill load per replica at or below this. Queueing delay
    # explodes only near 1.0, too late when a new replica needs tens of seconds to start.
    target_load: float = _spec_default(_A, "target_load")
    # remove one only if the rest would run below this
    scale_down_load: float = _spec_default(_A, "scale_down_load")
    # A replica added now serves only after start-up: size for the demand projected this far ahead
    # along its recent upward trend (the trend is ignored going down: scale-down waits for calm).
    lead_time_s: float = _spec_default(_A, "lead_time_seconds")

    def __post_init__(self) -> None:
        if self.mode not in SCALER_MODES:
            raise ValueError(f"scaler mode must be one of {', '.join(SCALER_MODES)}, got {self.mode!r}")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must be between 0 and maxReplicas ({self.max_replicas})"
            )
        if self.target_ttft_s <= 0:
            raise ValueError("targetTTFTSeconds must be > 0")
        if not 0 < self.scale_down_load < self.target_load:
            raise ValueError(
                f"scale_down_load ({self.scale_down_load}) must be > 0 and below target_load "
                f"({self.target_load})"
            )


@dataclass(frozen=True, slots=True)
class PlannerMemory:
    """What the planner must remember between rounds (returned in every plan, passed back in)."""

    last_scale_up_s: float | None = None
    last_scale_down_s: float | None = None
    calm_since_s: float | None = None
    demand: float | None = None  # the fleet prefill demand, smoothed (prefix-aware modes)
    demand_s: float | None = None
    demand_slope: float = 0.0  # its trend, replica-equivalents per second (demand_trend)
    # When the demand history began (the planner's first round). None with a demand: a restored
    # memory of unknown start, whose history counts as long enough (see ``_plan_prefix_aware``).
    demand_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class Prewarm:
    target: str  # an existing replica id, or "new-<i>" for the i-th replica this plan adds
    subtree_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ScalePlan:
    desired_replicas: int
    add: int = 0
    prewarm: tuple[Prewarm, ...] = ()
    drain: tuple[str, ...] = ()  # stop sending new requests; delete once idle
    remove: tuple[str, ...] = ()  # drained and idle: delete now
    reason: str = "steady"
    memory: PlannerMemory = field(default_factory=PlannerMemory)

    @property
    def is_noop(self) -> bool:
        return not (self.add or self.prewarm or self.drain or self.remove)


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """What a plan does and what held it back (``status.autoscaler.decision``)."""

    action: ScalingAction
    limited_by: ScalingLimit | None = None


# The beginnings of the reasons plan_scale gives when a bound, a wait or a cooldown holds it back
# (with_unavailable appends to a reason, never prefixes it). tests/test_autoscale_decision.py runs
# the planner into each of them, so a reworded reason fails there, not silently here.
_LIMITED_BY: tuple[tuple[str, ScalingLimit], ...] = (
    ("saturated, at maxReplicas", "TooManyReplicas"),
    ("above maxReplicas", "TooManyReplicas"),
    ("quiet, at minReplicas", "TooFewReplicas"),
    ("below minReplicas", "TooFewReplicas"),
    ("quiet for ", "ScaleDownStabilizing"),
    ("saturated, waiting", "ScaleUpDeferred"),
    ("quiet, but only one replica is ready", "TooFewReadyReplicas"),
    ("quiet, no ready replica to remove", "TooFewReadyReplicas"),
    ("prefill load ", "ColdStart"),  # a load reason on a hold: only the cold-start hold gives one
)


def classify_plan(plan: ScalePlan) -> PlanDecision:
    """The plan's action (from what it does) and what limits it (from its reason); decides nothing."""
    action: ScalingAction
    if plan.add:
        action = "ScaleUp"
    elif plan.drain:
        action = "ScaleDown"
    elif plan.prewarm:
        action = "Prewarm"
    else:
        action = "Hold"  # removing pods already drained is the reconcile's follow-up, not a decision
    limit = next((lim for start, lim in _LIMITED_BY if plan.reason.startswith(start)), None)
    return PlanDecision(action, limit)


def subtree_value(subtree: SubtreeObservation, prefill_s_per_token: float) -> float:
    """Prefill seconds per second the fleet saves by keeping this subtree cached."""
    return subtree.rate_rps * subtree.tokens * prefill_s_per_token


def choose_victim(
    replicas: Sequence[ReplicaObservation],
    subtrees: Sequence[SubtreeObservation],
    prefill_s_per_token: float,
) -> str | None:
    """The ready replica whose cache is worth least to the fleet.

    Worth = Σ over subtrees it *alone* holds of rate × recompute cost (a prefix another replica also
    holds survives the removal). Ties: fewer requests in flight (shorter drain), then the newest.
    """
    candidates = [r for r in replicas if r.phase == "ready"]
    if not candidates:
        return None
    unique_value = {r.replica_id: 0.0 for r in candidates}
    for s in subtrees:
        if len(s.holders) == 1:
            (holder,) = s.holders
            if holder in unique_value:
                unique_value[holder] += subtree_value(s, prefill_s_per_token)
    victim = min(candidates, key=lambda r: (unique_value[r.replica_id], r.in_flight, -r.created_s))
    return victim.replica_id


def warm_on_arrival(replicas: Sequence[ReplicaObservation], policy: ScalePolicy) -> bool:
    """Whether a new replica coming up now should run its planned warm-up before it takes traffic.

    Not while a ready replica already waits past saturation (``saturation`` × the TTFT target):
    that queue is what the replica was added for, and a warming replica serves nothing. Its warm-up
    (8 hot subtrees: ~2 s of prefill) then delays exactly the capacity the fleet is waiting for,
    while a cold replica learns the hot prefix from its first routed request. Decided when the
    replica arrives, not when it was planned a start-up time earlier: in a ramp the fleet was calm
    then. Measured: on viral the first replica of the ramp arrives to waits of 0.8–3.3 s (warmed, the
    p99 was 4–20 % worse than cold), on diurnal every one to waits ≤ 0.63 s (warmed, 1–10 % better).
    """
    saturated = policy.saturation * policy.target_ttft_s
    return not any(r.phase == "ready" and r.est_wait_s > saturated for r in replicas)


def _clamp(n: int, policy: ScalePolicy) -> int:
    return max(policy.min_replicas, min(policy.max_replicas, n))


def _cooled(last: float | None, now: float, cooldown: float) -> bool:
    return last is None or now - last >= cooldown


def plan_scale(
    observed: FleetObservation, policy: ScalePolicy, memory: PlannerMemory | None = None
) -> ScalePlan:
    """Decide replica count, pre-warming and scale-down victims for one control round."""
    memory = memory or PlannerMemory()
    remove = tuple(r.replica_id for r in observed.replicas if r.phase == "draining" and r.in_flight == 0)
    active = [r for r in observed.replicas if r.phase != "draining"]
    n = len(active)
    base = ScalePlan(desired_replicas=n, remove=remove, memory=memory)

    # Bounds first: they hold in every mode, whatever the load says.
    if n < policy.min_replicas:
        return replace(
            base,
            desired_replicas=policy.min_replicas,
            add=policy.min_replicas - n,
            reason=f"below minReplicas ({n} < {policy.min_replicas})",
        )
    if n > policy.max_replicas:
        excess = n - policy.max_replicas
        # Replicas not serving yet go first (starting before warming, newest first): their caches
        # hold nothing the fleet routes to, and taking the surplus from ready replicas alone could
        # leave none serving (maxReplicas lowered while a scale-up is still starting).
        unready = sorted(
            (r for r in active if r.phase != "ready"), key=lambda r: (r.phase != "starting", -r.created_s)
        )
        victims = tuple(r.replica_id for r in unready[:excess])
        victims += _victims(active, observed.subtrees, policy, excess - len(victims))
        return replace(
            base,
            desired_replicas=policy.max_replicas,
            drain=victims,
            reason=f"above maxReplicas ({n} > {policy.max_replicas})",
        )
    if policy.mode == "fixed_max":
        add = policy.max_replicas - n
        return replace(
            base,
            desired_replicas=policy.max_replicas,
            add=add,
            reason="fixed at maxReplicas" if add else "steady",
        )
    # A replica draining while the others are at minReplicas does not hold the plan: the ready ones
    # can still be saturated (it was removed when the fleet was calm), and a scale-up they need must
    # not wait for the drain. Nothing below drains at or under minReplicas ("quiet, at
    # minReplicas"), and the cooldown and stabilization period still hold between scale-ups and
    # scale-downs. (Until here such a round returned "steady": two ready replicas waiting 8 s each
    # got no replica while a third drained, where without it uniform added 2 and prefix_aware 1.)
    if policy.mode == "uniform":
        return _plan_uniform(observed, policy, memory, base, active)
    return _plan_prefix_aware(observed, policy, memory, base, active)


def _victims(
    active: Sequence[ReplicaObservation],
    subtrees: Sequence[SubtreeObservation],
    policy: ScalePolicy,
    count: int,
) -> tuple[str, ...]:
    chosen: list[str] = []
    pool = list(active)
    for _ in range(count):
        victim = choose_victim(pool, subtrees, policy.prefill_s_per_token)
        if victim is None:
            break
        chosen.append(victim)
        pool = [r for r in pool if r.replica_id != victim]
        # Once a holder leaves, a subtree it shared may become unique to another replica.
        subtrees = [replace(s, holders=s.holders - {victim}) for s in subtrees]
    return tuple(chosen)


def _plan_uniform(
    observed: FleetObservation,
    policy: ScalePolicy,
    memory: PlannerMemory,
    base: ScalePlan,
    active: Sequence[ReplicaObservation],
) -> ScalePlan:
    """Queue-depth target, like an HPA/KEDA on ``num_queue_reqs``: blind to which prefix is hot."""
    now = observed.now_s
    n = len(active)
    queued = sum(r.queued for r in active)
    desired = _clamp(math.ceil(queued / policy.target_queue_per_replica), policy)
    if desired > n and _cooled(memory.last_scale_up_s, now, policy.scale_up_cooldown_s):
        add = min(desired - n, policy.max_step_up)
        return replace(
            base,
            desired_replicas=n + add,
            add=add,
            memory=replace(memory, last_scale_up_s=now, calm_since_s=None),
            reason=f"queue {queued} > {policy.target_queue_per_replica:g}/replica × {n}",
        )
    if desired < n:
        return _maybe_scale_down(
            observed,
            policy,
            memory,
            base,
            active,
            f"queue {queued} fits {n - 1} replicas",
            prefix_aware=False,
        )
    return replace(base, memory=replace(memory, calm_since_s=None))


def _plan_prefix_aware(
    observed: FleetObservation,
    policy: ScalePolicy,
    memory: PlannerMemory,
    base: ScalePlan,
    active: Sequence[ReplicaObservation],
) -> ScalePlan:
    now = observed.now_s
    n = len(active)
    by_id = {r.replica_id: r for r in active}
    ready = [r for r in active if r.phase == "ready"]
    pending = [r for r in active if r.phase in ("starting", "warming")]
    saturated_wait = policy.saturation * policy.target_ttft_s
    idle_wait = policy.idle * policy.target_ttft_s
    # A subtree that no worker's cache holds is no one's queue and has no source to pre-warm from;
    # its requests are plain misses, already in the prefill demand. It can still have a rate: a
    # decayed average outlives the node (a prefix whose hits stop is evicted a few half-lives
    # later, still above hotRateRps). Counted as starved, such ghosts added 4 replicas on diurnal
    # seed 0 with cache_on_compute while no replica waited over 0.31 s, and by default their
    # (empty) pre-warms reset the quiet period. A holder this round does not observe (hung, left
    # out) still counts: its subtrees are starved and its sidecar can export them.
    hot = sorted(
        (s for s in observed.subtrees if s.rate_rps >= policy.hot_rate_rps and s.holders),
        key=lambda s: subtree_value(s, policy.prefill_s_per_token),
        reverse=True,
    )
    starved: list[SubtreeObservation] = []
    for s in hot:
        holders = [by_id[h] for h in s.holders if h in by_id and by_id[h].phase != "draining"]
        if any(h.phase in ("starting", "warming") for h in holders):
            continue  # help is already on its way
        if not holders or min(h.est_wait_s for h in holders) > saturated_wait:
            starved.append(s)
    fleet_busy = bool(ready) and min(r.est_wait_s for r in ready) > saturated_wait
    demand = _demand(observed)
    level, slope = demand, memory.demand_slope
    if memory.demand is not None and memory.demand_s is not None and now > memory.demand_s:
        level, slope = demand_trend(
            memory.demand, slope, demand, now - memory.demand_s, policy.lead_time_s / TREND_STEPS
        )
    since = memory.demand_since_s
    if since is None and memory.demand is None:
        since = now
    memory = replace(memory, demand=level, demand_s=now, demand_slope=slope, demand_since_s=since)
    base = replace(base, memory=memory)
    # A fleet that has just started (every serving replica younger than a lead time, and no longer
    # a demand history) has empty caches: every first request for a prefix is a full prefill, so
    # the demand is high for the seconds the caches take to fill, and a replica ordered for it
    # arrives a lead time later to a fleet that no longer needs it. Load alone does not scale up
    # then; waits (saturated subtrees, a busy fleet) still do. An operator restarted on a running
    # fleet sees older replicas and plans as before. Measured on viral: a replica added at 5 s for
    # 1.4-1.9 replica-equivalents of demand that fell to ~0.55 by 30 s (95 replica-seconds), and on
    # seed 13 its removal at 95 s left the two caches laid out worse for the ramp (SLO 94.9 % vs 96.5 %).
    history_s = None if since is None else now - since
    cold_start = (
        history_s is not None
        and history_s < policy.lead_time_s
        and all(
            0.0 <= now - r.created_s < policy.lead_time_s
            for r in observed.replicas
            if r.phase in ("ready", "draining")
        )
    )
    # Right after a scale-down demand rises by itself (the victim's prefixes are re-prefilled on the
    # others): that rise is no trend to provision for. Actual load still scales up at once.
    shrunk = memory.last_scale_down_s is not None and now - memory.last_scale_down_s < policy.lead_time_s
    # So does it right after a scale-up lands: the newcomer's cache is cold (or warmed with a few
    # subtrees), and the router sends it the holders' overflow, so the first request for each
    # prefix it gets is a miss that was a hit on a holder. Measured on viral 29: a replica arriving
    # cold at 180 s read 0.73 of load in its first 15 s, the demand 2.12 was projected to 2.85,
    # and a 5th replica was added for a plateau of 1.5-1.8 (100 replica-seconds, no SLO gained).
    newcomers = [r for r in ready if _newcomer(r, now, policy)]
    projected = demand + (0.0 if shrunk or newcomers else max(slope, 0.0)) * policy.lead_time_s
    if shrunk:
        outlook = f"trend ignored within {policy.lead_time_s:g}s of a scale-down"
    elif newcomers:
        outlook = f"trend ignored while {newcomers[0].replica_id} that just joined fills its cache"
    else:
        outlook = f"projected {projected:.2f} in {policy.lead_time_s:g}s"
    load = f"prefill load {demand:.2f} ({outlook})"  # what the load decisions below saw
    by_load = math.ceil(projected / policy.target_load - 1e-9)  # replicas the prefill demand needs
    short = by_load - n  # n counts starting/warming replicas: capacity already on its way
    # ...unless waits say the fleet is short anyway: then the load tells by how much (a fleet
    # started too small for its steady load, e.g. the Mooncake trace from 2 replicas).
    held = cold_start and short > 0 and not (starved or fleet_busy)
    if held:
        load = f"{load} needs {by_load}, but the demand history is {history_s:.0f}s: a cold start?"
        short = 0

    if starved or fleet_busy or short > 0:
        prewarm: list[Prewarm] = []
        idle = sorted((r for r in ready if r.est_wait_s < idle_wait), key=lambda r: r.est_wait_s)
        still_starved: list[SubtreeObservation] = []
        for s in starved:
            helper = next((r for r in idle if r.replica_id not in s.holders), None)
            if helper is None:
                still_starved.append(s)
                continue
            # An idle replica takes the overflow: warmed first, or (no pre-warm) cold — the router
            # already moves traffic off a saturated holder. A new replica would be idle capacity.
            idle.remove(helper)
            if policy.mode == "prefix_aware_prewarm":
                prewarm.append(Prewarm(helper.replica_id, (s.subtree_id,)))
        need = math.ceil(len(still_starved) / max(policy.prewarm_subtrees, 1))
        # A replica that just joined and is still idle is the capacity the last scale-up ordered:
        # the holders' queues were built before it served, and the router now moves their overflow
        # to it (it takes all of it, not only the subtree it is pre-warmed with). Its effect shows
        # within a few rounds; only if they still wait then is another replica needed. Measured on
        # viral (3, 10, 11, 23...): a 4th replica added at 170-180 s for the 5-7 starved subtrees
        # the just-arrived idle 3rd was not given, kept 105-280 s at a plateau 3 replicas serve.
        arrived = next((r for r in newcomers if r.est_wait_s < idle_wait), None)
        if arrived is not None:
            need = 0
        if fleet_busy:
            need = max(need, 1)
        if pending:
            need = 0  # don't stack scale-ups before the last one has landed...
        need = max(need, short)  # ...unless the load needs more than is already on its way
        add = min(need, policy.max_step_up, policy.max_replicas - n)
        # a scale-up the load asks for skips the cooldown: it already counts pending replicas
        if add and (short > 0 or _cooled(memory.last_scale_up_s, now, policy.scale_up_cooldown_s)):
            if policy.mode == "prefix_aware_prewarm":
                for i in range(add):
                    chunk = still_starved[i * policy.prewarm_subtrees : (i + 1) * policy.prewarm_subtrees]
                    chunk = chunk or hot[: policy.prewarm_subtrees]
                    if chunk:
                        prewarm.append(Prewarm(f"new-{i}", tuple(s.subtree_id for s in chunk)))
            if starved:
                why = f"{len(starved)} hot subtree(s) saturated (holders wait > {saturated_wait:.2f}s)"
            elif fleet_busy:
                why = f"every replica waits > {saturated_wait:.2f}s"
            else:
                why = f"{load} needs {by_load} replicas at {policy.target_load:g} each"
            return replace(
                base,
                desired_replicas=n + add,
                add=add,
                prewarm=tuple(prewarm),
                memory=replace(memory, last_scale_up_s=now, calm_since_s=None),
                reason=f"scale up by {add}: {why}",
            )
        if prewarm:
            return replace(
                base,
                prewarm=tuple(prewarm),
                memory=replace(memory, calm_since_s=None),
                reason=f"replicate {len(prewarm)} hot subtree(s) onto idle replicas",
            )
        if n >= policy.max_replicas:
            reason = "saturated, at maxReplicas"
        elif arrived is not None and still_starved and not pending:
            reason = f"saturated, waiting for {arrived.replica_id} that just joined to take the overflow"
        else:
            reason = "saturated, waiting"
        return replace(base, memory=replace(memory, calm_since_s=None), reason=reason)

    # Quiet: waits are low on average (one replica's burst is not load) and the prefill demand would
    # fit one replica fewer with room to spare (the gap to target_load is the hysteresis).
    mean_wait = sum(r.est_wait_s for r in ready) / len(ready) if ready else 0.0
    fits_fewer = projected <= policy.scale_down_load * (n - 1)
    if ready and mean_wait < idle_wait and fits_fewer and not pending:
        why = f"mean wait {mean_wait:.2f}s, {load} fits {n - 1} replicas"
        return _maybe_scale_down(observed, policy, memory, base, active, why, prefix_aware=True)
    return replace(base, memory=replace(memory, calm_since_s=None), reason=load if held else "steady")


def _newcomer(replica: ReplicaObservation, now: float, policy: ScalePolicy) -> bool:
    """A replica that has served for about a lead time or less: ready, and created within two lead
    times (one of them its start-up; the lead time is the start-up delay). A creation stamp in the
    planner's future (clock skew) is no evidence of youth."""
    return replica.phase == "ready" and 0.0 <= now - replica.created_s < 2 * policy.lead_time_s


def demand_trend(
    level: float, slope: float, demand: float, dt: float, horizon_s: float
) -> tuple[float, float]:
    """The demand's smoothed level and trend after one more sample (Holt's linear smoothing; both
    time constants ``horizon_s``). Returns ``(level, slope)``.

    A round's demand is noisy: a window of Poisson arrivals with prompts of very different sizes, a
    tenant's long prefix missed once. Averaging round-to-round slopes of the raw demand turned one
    jump into a trend (+0.16 in one round projected +0.3 a lead time ahead, and added a replica at
    the top of the diurnal curve); here the trend is the slope of the smoothed level, so one jump
    moves it a fraction as much while a ramp that lasts is followed within a few rounds.
    (Measured: ``docs/autoscaling.md``, "The planner", "the trend".)
    """
    weight = 1.0 - math.exp(-dt / horizon_s) if horizon_s > 0 else 1.0
    expected = level + slope * dt
    smoothed = expected + weight * (demand - expected)
    return smoothed, slope + weight * ((smoothed - level) / dt - slope)


def _demand(observed: FleetObservation) -> float:
    """The fleet's prefill demand (replica-equivalents) from replicas that take or took traffic.

    A warming replica takes no traffic: its prefill is the scaler's own warm-up. Counted, it looked
    like demand exactly while a ramp was being provisioned for and asked for one replica more."""
    return sum(r.prefill_load for r in observed.replicas if r.phase in ("ready", "draining"))


def _maybe_scale_down(
    observed: FleetObservation,
    policy: ScalePolicy,
    memory: PlannerMemory,
    base: ScalePlan,
    active: Sequence[ReplicaObservation],
    why: str,
    *,
    prefix_aware: bool,
) -> ScalePlan:
    """Remove one replica after a stable quiet period (the hysteresis that prevents flapping)."""
    now = observed.now_s
    n = len(active)
    calm_since = memory.calm_since_s if memory.calm_since_s is not None else now
    memory = replace(memory, calm_since_s=calm_since)
    if n <= policy.min_replicas:
        return replace(base, memory=memory, reason="quiet, at minReplicas")
    if now - calm_since < policy.scale_down_stabilization_s or not _cooled(
        memory.last_scale_up_s, now, policy.scale_down_stabilization_s
    ):
        return replace(base, memory=memory, reason=f"quiet for {now - calm_since:.0f}s ({why})")
    if sum(1 for r in active if r.phase == "ready") <= 1:
        # the others are still starting: draining the only one serving would leave no one to route to
        return replace(base, memory=memory, reason="quiet, but only one replica is ready")
    if prefix_aware:
        victim = choose_victim(active, observed.subtrees, policy.prefill_s_per_token)
    else:  # a cache-blind scaler removes the newest ready replica, as a ReplicaSet would
        ready = [r for r in active if r.phase == "ready"]
        victim = max(ready, key=lambda r: r.created_s).replica_id if ready else None
    if victim is None:
        return replace(base, memory=memory, reason="quiet, no ready replica to remove")
    return replace(
        base,
        desired_replicas=n - 1,
        drain=(victim,),
        memory=replace(memory, last_scale_down_s=now, calm_since_s=None),
        reason=f"scale down: {why} for {now - calm_since:.0f}s; drain {victim}",
    )
