"""The elastic fleet: the simulator's replicas come and go as the autoscaler plans.

Same service models (:mod:`.engine`) and routing policies as :func:`.simulator.simulate`; on top,
replicas have a phase (the planner's ``ReplicaPhase``):

* ``starting`` for ``startup_delay_s`` after the planner adds one (pod scheduled, weights loading);
* ``warming`` while prefill-only warm-up requests for the hot subtrees it was assigned run on it —
  they take real prefill time in its service model and fill its cache like any request;
* ``ready`` — the routing policy sees it (it sees *only* ready replicas);
* ``draining`` — no new requests; removed once idle.

Every ``control_interval_s`` the control loop does what the operator does: build each replica's
cache summary with the sidecar's own builder (:func:`prefixfleet.router.summary.build_summary`) over
what the sidecar knows (``ReplicaModel.sidecar_tree``: the model's mirror when it keeps one),
merge them with :func:`prefixfleet.operator.hot_subtrees.hot_subtrees`, read each replica's load,
call :func:`prefixfleet.operator.autoscale.plan_scale` and execute the plan. Pre-warm tokens are
taken from a holder's sidecar view by block hash (:func:`~prefixfleet.operator.hot_subtrees.find_prefix`),
which is what a sidecar's hot-prefix export provides.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from prefixfleet.operator.autoscale import (
    FleetObservation,
    PlannerMemory,
    ReplicaObservation,
    ReplicaPhase,
    ScalePlan,
    ScalePolicy,
    SubtreeObservation,
    warm_on_arrival,
)
from prefixfleet.operator.autoscale import plan_scale as plan_scale_fn
from prefixfleet.operator.hot_subtrees import HotState, find_prefix, hot_subtrees, parse_subtree_id
from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS, CacheIdentity
from prefixfleet.router.policies import DEFAULT_POLICY, RouteRequest, make_policy
from prefixfleet.router.summary import DEFAULT_HOT_K, Summary, build_summary

from .engine import Job, ReplicaModel, ServiceConfig, make_replica
from .workloads import WorkloadRequest


@dataclass(frozen=True, slots=True)
class ElasticConfig:
    """The fleet and the control loop; ``policy`` is the scaler's :class:`ScalePolicy`."""

    cache_tokens: int
    policy: ScalePolicy
    service: ServiceConfig = field(default_factory=ServiceConfig)
    initial_replicas: int | None = None  # None: minReplicas (maxReplicas for fixed_max)
    startup_delay_s: float = 30.0
    control_interval_s: float = 5.0
    routing_policy: str = DEFAULT_POLICY
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    hot_k: int = DEFAULT_HOT_K
    load_window_s: float = 15.0  # prefill load is a rate over this window

    def __post_init__(self) -> None:
        if self.cache_tokens <= 0:
            raise ValueError(f"cache_tokens must be positive, got {self.cache_tokens}")
        if self.startup_delay_s < 0:
            raise ValueError(f"startup_delay_s must be >= 0, got {self.startup_delay_s}")
        if self.control_interval_s <= 0:
            raise ValueError(f"control_interval_s must be > 0, got {self.control_interval_s}")
        if self.policy.max_replicas < 1:
            raise ValueError("maxReplicas must be at least 1: someone has to serve")
        n = self.initial
        if not self.policy.min_replicas <= n <= self.policy.max_replicas or n < 1:
            raise ValueError(
                f"initial replicas ({n}) must be between minReplicas ({self.policy.min_replicas}) and "
                f"maxReplicas ({self.policy.max_replicas}) and at least 1"
            )

    @property
    def initial(self) -> int:
        if self.initial_replicas is not None:
            return self.initial_replicas
        if self.policy.mode == "fixed_max":
            return self.policy.max_replicas
        return max(self.policy.min_replicas, 1)


class Member:
    """One replica of the elastic fleet: its engine model plus lifecycle."""

    __slots__ = (
        "created_s",
        "drain_s",
        "initial",
        "model",
        "name",
        "outstanding",
        "phase",
        "prewarm",
        "ready_s",
        "removed_s",
        "uncached_samples",
        "uncached_total",
        "warmups",
    )

    def __init__(self, index: int, model: ReplicaModel, created_s: float, *, initial: bool) -> None:
        self.name = f"r{index}"
        self.model = model
        self.created_s = created_s
        self.initial = initial
        self.phase: ReplicaPhase = "ready" if initial else "starting"
        self.ready_s: float | None = created_s if initial else None
        self.drain_s: float | None = None
        self.removed_s: float | None = None
        self.prewarm: list[bytes] = []  # prefixes to warm once started
        self.warmups: list[Job] = []
        self.uncached_total = 0  # uncached prompt tokens sent here (what its sidecar counts)
        self.uncached_samples: deque[tuple[float, int]] = deque([(created_s, 0)])
        self.outstanding: list[Job] = []  # sent here, not known to have finished

    def accept(self, job: Job, now: float) -> None:
        self.model.accept(job, now)
        self.uncached_total += job.est_uncached
        self.outstanding.append(job)

    def idle(self, now: float) -> bool:
        """Every request sent here (warm-ups included) has finished by ``now``. The load a planner
        reads can miss one: a request still on its way to an emulated sidecar (``forward_delay_s``)
        is in no load record built meanwhile, so a drained replica can read idle while one is in
        transit; removed then, that request was never served."""
        self.outstanding = [j for j in self.outstanding if not j.finish_s <= now]  # nan: not finished
        return not self.outstanding

    def prefill_load(self, now: float, window_s: float, prefill_s_per_token: float) -> float:
        """Prefill seconds per second sent here over the last ``window_s`` (like a Prometheus rate)."""
        samples = self.uncached_samples
        samples.append((now, self.uncached_total))
        while len(samples) > 2 and samples[1][0] <= now - window_s:
            samples.popleft()
        t0, u0 = samples[0]
        return (self.uncached_total - u0) * prefill_s_per_token / (now - t0) if now > t0 else 0.0

    def warm_done_s(self) -> float | None:
        """When the last warm-up's prefill ends, once every one of them has been scheduled."""
        if any(math.isnan(j.ttft_s) for j in self.warmups):
            return None
        return max((j.arrival_s + j.ttft_s for j in self.warmups), default=None)


@dataclass(slots=True)
class ElasticRun:
    """Outcome of one scaler on one trace."""

    scaler: str
    horizon_s: float
    arrival_s: list[float]
    ttft_s: list[float]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    member: list[int]  # index into ``members`` per request
    members: list[Member]
    # per control round: (t, replicas that exist, ready ones, ones not draining)
    timeline: list[tuple[float, int, int, int]]
    plans: list[tuple[float, str]]  # (t, reason) of every plan that did something
    scale_events: int = 0
    warmup_requests: int = 0
    warmup_tokens: int = 0
    warmups_skipped: int = 0  # planned warm-ups not run: the replica arrived to a saturated fleet


class ElasticFleet:
    """The simulated fleet plus its control loop (one scaler, one run)."""

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.members: list[Member] = []
        self.live: list[Member] = []
        self.memory = PlannerMemory()
        self.hot_state: HotState | None = None
        self.identity_seed = CacheIdentity().seed()
        self.routing = make_policy(config.routing_policy, config.service.cost)
        self.timeline: list[tuple[float, int, int, int]] = []
        self.plans: list[tuple[float, str]] = []
        self.scale_events = 0
        self.warmup_requests = 0
        self.warmup_tokens = 0
        self.warmups_skipped = 0  # new replicas that arrived to a saturated fleet and served cold
        self._warm_seq = 0
        for _ in range(config.initial):
            self._add(0.0, initial=True)

    # -- membership -------------------------------------------------------------------------------

    def _add(self, now: float, *, initial: bool = False) -> Member:
        index = len(self.members)
        member = Member(
            index, make_replica(index, self.config.cache_tokens, self.config.service), now, initial=initial
        )
        self.members.append(member)
        self.live.append(member)
        return member

    def ready(self) -> list[Member]:
        return [m for m in self.live if m.phase == "ready"]

    def _warm(self, member: Member, prefixes: Sequence[bytes], now: float) -> None:
        for tokens in prefixes:
            self._warm_seq += 1
            job = Job(-self._warm_seq, now, tokens, 1)  # prefill-only: the first token ends it
            # the sidecar's estimate, as for a routed request (its load counter, the engine's queue)
            job.est_uncached = job.total - member.model.sidecar_tree().matched_tokens(tokens)
            member.accept(job, now)
            member.warmups.append(job)
            self.warmup_requests += 1
            self.warmup_tokens += job.total

    # -- time -------------------------------------------------------------------------------------

    def _next_transition(self) -> tuple[float, Member] | None:
        best: tuple[float, Member] | None = None
        for m in self.live:
            if m.phase == "starting":
                t = m.created_s + self.config.startup_delay_s
            elif m.phase == "warming":
                done = m.warm_done_s()
                if done is None:
                    continue
                t = done
            else:
                continue
            if best is None or t < best[0]:
                best = (t, m)
        return best

    def _transition(self, member: Member, now: float) -> None:
        if member.phase == "starting" and member.prewarm:
            prefixes, member.prewarm = member.prewarm, []
            if warm_on_arrival(self._serving(now), self.config.policy):
                member.phase = "warming"
                self._warm(member, prefixes, now)
                return
            self.warmups_skipped += 1  # the fleet is queueing for it: serve at once, cold
        member.phase = "ready"
        member.ready_s = now

    def advance(self, until: float, next_tick: float, horizon: float) -> float:
        """Process engine steps, phase changes and control rounds due by ``until``; return the next tick."""
        while True:
            ev_t, ev_m = math.inf, None
            for m in self.live:
                t = m.model.next_event_s()
                if t is not None and t < ev_t:
                    ev_t, ev_m = t, m
            trans = self._next_transition()
            tr_t = trans[0] if trans else math.inf
            tick = next_tick if next_tick <= horizon else math.inf
            first = min(ev_t, tr_t, tick)
            if first > until or first == math.inf:
                return next_tick
            if ev_m is not None and ev_t == first:
                ev_m.model.on_event(ev_t)
            elif trans is not None and tr_t == first:
                self._transition(trans[1], tr_t)
            else:
                self.control(tick)
                next_tick = tick + self.config.control_interval_s

    def _serving(self, now: float) -> list[ReplicaObservation]:
        """The ready replicas' waits right now (what the executor reads when a replica arrives)."""
        return [
            ReplicaObservation(m.name, "ready", est_wait_s=m.model.view(_at(now)).wait_s)
            for m in self.ready()
        ]

    # -- control ----------------------------------------------------------------------------------

    def summaries(self, now: float) -> dict[str, Summary]:
        out = {}
        for m in self.live:
            summary, _exports = build_summary(
                m.model.sidecar_tree(),
                worker=m.name,
                version=0,
                now=now,
                identity_seed=self.identity_seed,
                block_tokens=self.config.block_tokens,
                namespace_seed=lambda ns: self.identity_seed,
                wall_time_of=lambda tick: now,
                hot_k=self.config.hot_k,
            )
            out[m.name] = summary
        return out

    def observe(self, now: float) -> FleetObservation:
        subtrees: list[SubtreeObservation] = []
        if self.config.policy.mode in ("prefix_aware", "prefix_aware_prewarm"):
            subtrees, self.hot_state = hot_subtrees(self.summaries(now), self.hot_state, now)
        replicas = []
        for m in self.live:
            view = m.model.view(_at(now))
            replicas.append(
                ReplicaObservation(
                    replica_id=m.name,
                    phase=m.phase,
                    in_flight=view.in_flight,
                    queued=m.model.prefill_backlog(now),
                    est_wait_s=view.wait_s if m.phase != "starting" else 0.0,
                    cached_tokens=view.cached_tokens,
                    capacity_tokens=view.capacity_tokens,
                    created_s=m.created_s,
                    prefill_load=m.prefill_load(
                        now, self.config.load_window_s, self.config.service.prefill_s_per_token
                    ),
                )
            )
        return FleetObservation(now, tuple(replicas), tuple(subtrees))

    def control(self, now: float) -> ScalePlan:
        observed = self.observe(now)
        plan = plan_scale_fn(observed, self.config.policy, self.memory)
        self.memory = plan.memory
        self.execute(plan, observed, now)
        active = sum(1 for m in self.live if m.phase != "draining")
        self.timeline.append((now, len(self.live), len(self.ready()), active))
        return plan

    def _prefix_tokens(self, sid: str, holders: frozenset[str]) -> bytes | None:
        block_hash = parse_subtree_id(sid)
        for m in self.live:  # a holder's sidecar exports the prefix behind a published hash
            if m.name in holders:
                found = find_prefix(
                    m.model.sidecar_tree(),
                    block_hash,
                    block_tokens=self.config.block_tokens,
                    namespace_seed=lambda ns: self.identity_seed,
                )
                if found is not None:
                    return found.token_bytes
        return None

    def execute(self, plan: ScalePlan, observed: FleetObservation, now: float) -> None:
        by_name = {m.name: m for m in self.live}
        for name in plan.remove:
            m = by_name.get(name)
            if m is None or m.phase != "draining" or m.model.view(_at(now)).in_flight:
                continue
            if m.idle(now):  # the plan saw it idle; it goes once it is (a graceful stop serves what arrives)
                m.removed_s = now
                self.live.remove(m)
                self.routing.on_replica_removed(m.model.replica_id)
        for name in plan.drain:
            m = by_name.get(name)
            if m is not None and m.phase != "draining":
                m.phase = "draining"
                m.drain_s = now
        added = [self._add(now) for _ in range(plan.add)]
        holders = {s.subtree_id: s.holders for s in observed.subtrees}
        for warm in plan.prewarm:
            prefixes = [
                tokens
                for sid in warm.subtree_ids
                if (tokens := self._prefix_tokens(sid, holders.get(sid, frozenset()))) is not None
            ]
            if warm.target.startswith("new-"):
                i = int(warm.target[len("new-") :])
                if i < len(added):
                    added[i].prewarm.extend(prefixes)
            elif (m := by_name.get(warm.target)) is not None and m.phase == "ready":
                self._warm(m, prefixes, now)
        if plan.add or plan.drain:
            self.scale_events += 1
        if not plan.is_noop:
            self.plans.append((now, plan.reason))


def _at(now: float) -> RouteRequest:
    return RouteRequest(tokens=b"", num_tokens=0, now=now)


def simulate_elastic(
    requests: Sequence[WorkloadRequest],
    config: ElasticConfig,
    *,
    progress: bool | None = None,
    label: str | None = None,
) -> ElasticRun:
    """Route ``requests`` over an elastic fleet driven by ``config.policy``; serve them all."""
    fleet = ElasticFleet(config)
    horizon = requests[-1].arrival_s if requests else 0.0
    jobs = [Job(i, r.arrival_s, r.tokens, r.output_tokens) for i, r in enumerate(requests)]
    member_of = [-1] * len(jobs)
    next_tick = config.control_interval_s
    bar = tqdm(
        total=len(jobs),
        desc=f"sim-autoscale {label or config.policy.mode}",
        unit="req",
        file=sys.stderr,
        disable=(not progress) if progress is not None else None,
        leave=False,
    )
    with bar:
        for i, (job, req) in enumerate(zip(jobs, requests, strict=True)):
            now = req.arrival_s
            next_tick = fleet.advance(now, next_tick, horizon)
            ready = fleet.ready()
            if not ready:  # bounds keep one ready replica; a starting fleet waits for its first
                raise RuntimeError(f"no ready replica at t={now:.3f}s")
            route = RouteRequest(
                tokens=req.tokens, num_tokens=job.total, now=now, max_new_tokens=req.output_tokens
            )
            views = [m.model.view(route) for m in ready]
            decision = fleet.routing.choose(route, views)
            pos = next((k for k, v in enumerate(views) if v.replica_id == decision.replica_id), None)
            if pos is None:
                raise RuntimeError(f"policy chose unknown replica {decision.replica_id!r}")
            fleet.routing.on_routed(route, decision)
            chosen = ready[pos]
            job.replica = chosen.model.replica_id
            job.est_uncached = job.total - views[pos].matched_tokens
            chosen.accept(job, now)
            member_of[i] = job.replica  # a member's replica id is its index in fleet.members
            if i % 256 == 255:
                bar.update(256)
        fleet.advance(math.inf, math.inf, horizon)
        bar.update(len(jobs) % 256)
    unserved = [j.index for j in jobs if math.isnan(j.ttft_s)]
    if unserved:
        raise RuntimeError(f"{len(unserved)} requests never got a first token (first: #{unserved[0]})")
    return ElasticRun(
        scaler=label or config.policy.mode,
        horizon_s=horizon,
        arrival_s=[j.arrival_s for j in jobs],
        ttft_s=[j.ttft_s for j in jobs],
        prompt_tokens=[j.total for j in jobs],
        cached_tokens=[j.matched for j in jobs],
        member=member_of,
        members=fleet.members,
        timeline=fleet.timeline,
        plans=fleet.plans,
        scale_events=fleet.scale_events,
        warmup_requests=fleet.warmup_requests,
        warmup_tokens=fleet.warmup_tokens,
        warmups_skipped=fleet.warmups_skipped,
    )
