"""The autoscaler's loop against the local fleet: the operator's observe → plan_scale → execute, with
local processes instead of pods (``prefixfleet up --autoscale``).

Observation is the operator's (:mod:`prefixfleet.operator.autoscale_observe`): each replica's load
record and summary from Redis, merged by ``hot_subtrees``, and its engine's token rates — from a
Prometheus scraping the fleet with :mod:`prefixfleet.observability.local_prometheus`'s labels
(``namespace="local"``, ``fleet``, ``pod`` = worker id) when ``prometheus_url`` is set, else and
whenever that fails from the sidecar's ``/metrics``. Execution with processes:

* scale up: start an engine and its sidecar (``replica-<k>``); its state is set ``warming`` as soon
  as its sidecar answers, then ``POST /prefixfleet/warm`` copies the assigned hot prefixes from a
  holder (``hold_traffic``: no traffic until warmed; the warm endpoint returns it to ``ready``) —
  unless a ready replica waits past saturation as it arrives (``warm_on_arrival``, on the load
  records read then): it serves at once, cold;
* pre-warm of an idle existing replica: the same warm request without ``hold_traffic``: it keeps
  serving while it warms (as the simulator models it);
* scale down: the planner's victim is set ``draining`` through its sidecar (gateways stop sending it
  new requests); once nothing is in flight (at least :data:`MIN_DRAIN_S`, at most ``drain_timeout_s``)
  its sidecar and engine are stopped (the sidecar deregisters itself from Redis on the way out).

Every state change is checked (:meth:`LocalAutoscaler._post_state`): a 401 (the token rotated since it
was read) reads the token again, a 503 (the sidecar cannot confirm the token: Redis down past its
grace) or a refused or reset connection is tried again briefly (a timeout is not: each attempt would
wait it out again), and a change that still fails is an ``error`` event naming the replica, the state
and the sidecar's answer. A replica the loop itself left ``warming`` or
``draining`` (its ``ready`` never got through after a warm-up, or after a drain whose stop failed) is
set ``ready`` by a later round (:func:`stranded`), as the operator removes a leftover warming mark; a
state set by someone else (a person draining a replica by hand) is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
import yaml
from redis.exceptions import RedisError

from prefixfleet.cancellation import cancel_and_wait
from prefixfleet.fleet.local import LocalFleet, Replica
from prefixfleet.observability.local_prometheus import LocalPrometheus, ScrapeTarget, scrape_config
from prefixfleet.operator.autoscale import (
    FleetObservation,
    PlannerMemory,
    ReplicaObservation,
    ScalePlan,
    ScalePolicy,
    SubtreeObservation,
    plan_scale,
    warm_on_arrival,
)
from prefixfleet.operator.autoscale_observe import (
    ENGINE_API_METRICS,
    EngineReading,
    TokenCounters,
    observe_fleet,
    outage_notice,
)
from prefixfleet.operator.autoscale_sources import read_engine_metrics, read_records, replicas_now
from prefixfleet.operator.hot_subtrees import HotState, hot_subtrees
from prefixfleet.operator.planner import ObservedPod
from prefixfleet.operator.prometheus_source import PrometheusScope, PrometheusSource
from prefixfleet.router.control import REREAD_INTERVAL_S, control_headers, fleet_control_token
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.prewarm import warm_replica
from prefixfleet.router.records import LoadReport, decode_load
from prefixfleet.router.redis_conn import redis_error_text
from prefixfleet.router.summary import SummaryError

LOCAL_NAMESPACE = "local"  # the namespace label local_prometheus gives a local fleet's series
MIN_DRAIN_S = 2.0  # every gateway has refreshed its view (0.2 s polls) before the process goes
HTTP_TIMEOUT_S = 5.0
WARM_TIMEOUT_S = 120.0
# A state post is sent at most this many times; the pause before a retry starts at STATE_RETRY_S and
# doubles (0.25, 0.5, 1 s: ~2 s in all, enough for a sidecar restarting its listener or a Redis blip;
# a longer outage is left to the next rounds, see `stranded`). Not after a timeout: each attempt at a
# silent sidecar costs HTTP_TIMEOUT_S, and four would hold a drain or warm-up back ~22 s.
STATE_POST_ATTEMPTS = 4
STATE_RETRY_S = 0.25
# How long a drain whose `draining` timed out watches the replica's load record: a sidecar publishes
# it every 0.25 s, and gateways stop routing to one whose record stops changing (router.view).
HEARTBEAT_WATCH_S = 1.0


def fleet_targets(fleet: LocalFleet) -> list[ScrapeTarget]:
    """What a Prometheus for this fleet scrapes: every replica's sidecar (engine metrics included)
    and every gateway, labelled like the chart's monitors label them."""
    targets = [
        ScrapeTarget("prefixfleet-replica", r.sidecar_url, r.worker_id)
        for r in fleet.replicas
        if r.sidecar_url
    ]
    targets += [
        ScrapeTarget("prefixfleet-gateway", url, f"gateway-{i}") for i, url in enumerate(fleet.gateway_urls)
    ]
    return targets


class FleetPrometheus:
    """A local Prometheus (``prefixfleet up --autoscale --prometheus local``) whose static targets
    follow the fleet as the autoscaler adds and removes replicas (config rewritten, then reloaded)."""

    def __init__(self, fleet: LocalFleet, directory: Path, port: int, interval_s: float = 1.0) -> None:
        self.fleet = fleet
        self.interval_s = interval_s
        self.targets = fleet_targets(fleet)
        directory.mkdir(parents=True, exist_ok=True)
        self.prometheus = LocalPrometheus(directory, port, self._config(self.targets))

    @property
    def url(self) -> str:
        return self.prometheus.url

    def _config(self, targets: Sequence[ScrapeTarget]) -> dict[str, Any]:
        return scrape_config(
            targets, fleet=self.fleet.spec.fleet_name, namespace=LOCAL_NAMESPACE, interval_s=self.interval_s
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.prometheus.start)

    async def follow(self) -> bool:
        """Rewrite and reload the scrape config if the fleet's processes changed; True if it did."""
        targets = fleet_targets(self.fleet)
        if targets == self.targets:
            return False
        self.prometheus.config_path.write_text(yaml.safe_dump(self._config(targets), sort_keys=False))
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            resp = await http.post(f"{self.url}/-/reload")
        if resp.status_code != 200:
            raise RuntimeError(
                f"prometheus refused the new config: HTTP {resp.status_code} {resp.text[:200]}"
            )
        self.targets = targets
        return True

    async def stop(self) -> None:
        await asyncio.to_thread(self.prometheus.stop)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    at_s: float
    action: str  # scale_up, scale_down, prewarm, drain, removed, engine_metrics, error
    detail: str


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What a round observes of the local fleet, read at one moment (no await in between): its
    replicas, how many are still starting, and each one's state and creation time."""

    replicas: tuple[Replica, ...]
    starting: int
    draining: frozenset[str]
    warming: frozenset[str]
    created: Mapping[str, float]

    @property
    def names(self) -> list[str]:
        return [r.worker_id for r in self.replicas]

    def wanted(self) -> int:
        """The replicas the fleet is to have: those not draining, and those still starting."""
        return sum(1 for n in self.names if n not in self.draining) + self.starting

    def pods(self) -> list[ObservedPod]:
        """The replicas as the operator's observation sees pods (all Running and Ready: a local
        replica joins the fleet once its sidecar answers)."""
        return [
            ObservedPod(
                n,
                phase="Running",
                ready=True,
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created.get(n, 0.0))),
                state="draining" if n in self.draining else "warming" if n in self.warming else "ready",
                draining_since="local" if n in self.draining else "",
            )
            for n in self.names
        ]


class PostStep(enum.Enum):
    """What to do after a sidecar's answer to a state post."""

    DONE = "done"  # 2xx: the state is set
    REREAD = "reread"  # 401: the token rotated since it was read; read it again, then retry
    RETRY = "retry"  # 5xx (503: the sidecar cannot confirm the token) or no quick answer: retry after a pause
    GIVE_UP = "give_up"  # another 4xx (the same request gets the same answer), a timeout, or no attempt left


def state_post_step(
    status: int | None, attempt: int, attempts: int = STATE_POST_ATTEMPTS, *, silent: bool = False
) -> PostStep:
    """The next step after attempt ``attempt`` (0-based) of a state post answered ``status`` (None:
    no answer, e.g. the connection was refused or reset; ``silent``: none within the timeout, which
    a retry would only wait out again)."""
    if status is not None and 200 <= status < 300:
        return PostStep.DONE
    if attempt + 1 >= attempts or (status is None and silent):
        return PostStep.GIVE_UP
    if status == 401:
        return PostStep.REREAD
    if status is None or status >= 500:
        return PostStep.RETRY
    return PostStep.GIVE_UP


def retry_pause_s(step: PostStep, attempt: int, token_changed: bool) -> float:
    """The pause before the next attempt. After a 401 with a token that did not change on re-reading,
    at least the sidecar's re-read interval: it checks a token against a reading up to that old, so it
    may still hold the token from before a rotation; a changed token is sent at once."""
    pause = STATE_RETRY_S * 2**attempt
    if step is PostStep.REREAD:
        return 0.0 if token_changed else max(pause, REREAD_INTERVAL_S)
    return pause


def stranded(
    states: Mapping[str, str], left: Set[str], warming: Set[str], draining: Set[str], present: Set[str]
) -> list[str]:
    """The replicas (of ``present``, the fleet now) the loop itself left out of rotation (``left``: it
    set them ``warming`` or ``draining`` and their ``ready`` never got through, answered 401/503 or not
    at all) whose published state (``states``, from their load records) still says so though the loop
    neither warms (``warming``) nor drains (``draining``) them: every gateway skips them while the
    planner counts them as serving. They are to be set ``ready``. A state the loop did not set (a
    person's ``POST /prefixfleet/state {"state": "draining"}`` to test failover) is not the loop's to
    undo: such a replica is not in ``left``."""
    return sorted(
        name
        for name, state in states.items()
        if state in ("warming", "draining")
        and name in left
        and name in present
        and name not in warming
        and name not in draining
    )


@dataclass(frozen=True, slots=True)
class StatePosted:
    """How a state post ended: ``ok`` (the sidecar answered 2xx), the token last sent (re-read after a
    401: the one for the next control request), the sidecar's last status (None: no answer), its
    answer in words (for the event), and whether the last attempt timed out (``silent``: the sidecar
    took the connection, or may still, and said nothing)."""

    ok: bool
    token: str
    status: int | None
    answer: str
    silent: bool = False


def may_have_landed(posted: StatePosted) -> bool:
    """Whether a state post may have set its state: it was answered 2xx, or not answered at all (the
    sidecar may have set it before the connection broke). A refusal (any other answer) set nothing."""
    return posted.ok or posted.status is None


def drain_goes_on(posted: StatePosted) -> bool:
    """Whether a drain goes on to stop its replica after its ``draining`` post: when it was set, or
    when the sidecar could not be reached (refused, reset: nothing serves there). Not when it
    answered a refusal: it is up and gateways still send it requests, which the stop would cut. Nor
    when it kept silent past the timeout: it holds connections, gateways' included, and nothing says
    it left rotation (a later round may choose it again; `stranded` undoes a draining that landed)."""
    return posted.ok or (posted.status is None and not posted.silent)


def heartbeat_stopped(before: LoadReport | None, after: LoadReport | None) -> bool:
    """Whether a sidecar no longer publishes its load record: gone (expired), or the same one
    (``seq``) :data:`HEARTBEAT_WATCH_S` later. Gateways route nothing to such a replica (a hung or
    stopped process), so a drain whose ``draining`` timed out may stop it (:func:`drain_goes_on`
    otherwise keeps a silent one: it may be a slow one under traffic)."""
    return after is None or (before is not None and after.seq == before.seq)


def in_flight(status: Any) -> bool:
    """Whether a sidecar's ``/prefixfleet/status`` answer says requests are still in flight. An answer
    of another shape tells nothing to wait for (as an unreachable sidecar): the drain goes on."""
    load = status.get("load") if isinstance(status, dict) else None
    return bool(load.get("in_flight")) if isinstance(load, dict) else False


def present_only(created: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """``created`` for the replicas ``names`` only: without forgetting the ones gone, a long
    ``prefixfleet up --autoscale`` run kept the creation time of every replica it ever started."""
    present = set(names)
    return {name: at for name, at in created.items() if name in present}


@dataclass
class LocalAutoscaler:
    """Runs rounds every ``interval_s`` against ``fleet`` until cancelled or ``stop`` is set."""

    fleet: LocalFleet
    policy: ScalePolicy
    interval_s: float = 2.0
    drain_timeout_s: float = 30.0
    prometheus_url: str | None = None
    prometheus_window_s: int = 10
    memory: PlannerMemory = field(default_factory=PlannerMemory)
    hot: HotState | None = None
    counters: dict[str, TokenCounters] = field(default_factory=dict)
    engines: EngineReading | None = None  # the last round's engine rates and their source
    events: list[ScaleEvent] = field(default_factory=list)
    starting: int = 0
    reserved: set[int] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)
    warming: set[str] = field(default_factory=set)
    prewarming: set[str] = field(default_factory=set)  # existing replicas with a warm-up in flight
    restoring: set[str] = field(default_factory=set)  # stranded replicas being set ready (one task each)
    # replicas whose `warming` or `draining` the loop set (or may have: no answer) and has not undone
    # yet; only these are ever set ready by `stranded` (forgotten once ready again or gone)
    left: set[str] = field(default_factory=set)
    created: dict[str, float] = field(default_factory=dict)  # of the fleet's replicas (pruned each round)
    observed: FleetObservation | None = None  # the last round's (whether a new one warms, if Redis fails)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        redis = aioredis.from_url(self.fleet.redis_url, socket_timeout=2.0)
        prometheus = PrometheusSource(self.prometheus_url) if self.prometheus_url else None
        try:
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
                try:
                    while not stop.is_set():
                        try:
                            await self.round(redis, http, prometheus)
                        except (RedisError, OSError, httpx.HTTPError) as exc:
                            self._event("error", f"round skipped: {redis_error_text(exc)}")
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), self.interval_s)
                finally:
                    # Also when this loop is cancelled: a replica start or drain must not outlive it
                    # (it would start processes during the fleet's teardown, on a closed client).
                    for task in await cancel_and_wait(self.tasks):
                        self._event("error", f"{task.get_name()} did not stop; leaving it")
        finally:
            if prometheus is not None:
                prometheus.close()
            await redis.aclose()

    def _event(self, action: str, detail: str) -> None:
        self.events.append(ScaleEvent(time.time(), action, detail))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        # A replica that failed to start (or a drain that broke) is a decision not carried out: say so.
        if not task.cancelled() and (exc := task.exception()) is not None:
            what = getattr(task.get_coro(), "__name__", task.get_name())
            self._event("error", f"{what}: {exc.__class__.__name__}: {redis_error_text(exc)}")

    def prometheus_scope(self) -> PrometheusScope:
        labels = (("fleet", self.fleet.spec.fleet_name), ("namespace", LOCAL_NAMESPACE))
        # the engines' own series (SGLang's or vLLM's), read from Prometheus or the sidecars' /metrics
        metrics = ENGINE_API_METRICS[self.fleet.spec.engine.api]
        return PrometheusScope(labels, self.prometheus_window_s, metrics=metrics)

    async def read_engines(
        self, http: httpx.AsyncClient, urls: Mapping[str, str], prometheus: PrometheusSource | None
    ) -> EngineReading:
        """This round's engine rates (Prometheus first, the sidecars for the rest); an outage of
        the configured Prometheus is one ``engine_metrics`` event when it starts and one when it ends."""
        last = self.engines.rates if self.engines is not None else None
        reading = await read_engine_metrics(
            http, urls, self.counters, prometheus, self.prometheus_scope(), last
        )
        self.counters = dict(reading.counters)
        notice = outage_notice(self.engines is not None and self.engines.degraded, reading)
        if notice is not None:
            self._event("engine_metrics", notice[1].removeprefix("engine metrics: "))
        self.engines = reading
        return reading

    async def round(
        self, redis: aioredis.Redis, http: httpx.AsyncClient, prometheus: PrometheusSource | None = None
    ) -> ScalePlan:
        # Everything the observation uses, read at one moment, before the awaits below: a start that
        # completes meanwhile moves a replica from `starting` into the fleet (a later count of
        # `starting` missed it: a second scale-up), a drain that completes takes one out of the fleet
        # and out of `draining` (a later read of `draining` counted it as serving: a second scale-down).
        view = self.view()
        names = view.names
        # Also at that moment (no await since view()): a replica's creation time is kept while it is
        # in the fleet (_add_replica records it as the replica joins), so one not in the view is gone
        # (drained, or reaped) and is forgotten; after the awaits, a replica that joined meanwhile
        # would be missing from `names` and lose its own.
        self.created = present_only(self.created, names)
        self.left &= set(names)
        loads, summaries = await read_records(redis, FleetKeys(self.fleet.spec.fleet_name), names)
        urls = {r.worker_id: r.sidecar_url for r in view.replicas if r.sidecar_url}
        reading = await self.read_engines(http, urls, prometheus)
        now = time.time()
        subtrees, self.hot = hot_subtrees(summaries, self.hot, now, workers=set(names))
        observed = observe_fleet(
            now, view.wanted(), view.pods(), loads, reading.prefill_loads(loads), subtrees, reading.queues()
        )
        plan = plan_scale(observed, self.policy, self.memory)
        self.memory, self.observed = plan.memory, observed
        self.restore_stranded({n: load.state for n, load in loads.items()}, urls, http, redis)
        await self.execute(plan, subtrees, urls, http, redis)
        return plan

    def restore_stranded(
        self,
        states: Mapping[str, str],
        urls: Mapping[str, str],
        http: httpx.AsyncClient,
        redis: aioredis.Redis,
    ) -> None:
        """Set ``ready`` every replica :func:`stranded` names. Judged against ``warming`` and
        ``draining`` as they are now, with no await before the tasks are started: a warm-up or drain
        adds its replica to them before its first state post and removes it only after its last."""
        present = {n for n in urls if self._observed_replica(n, urls) is not None}
        for name in stranded(states, self.left, self.warming, self.draining | self.restoring, present):
            self.restoring.add(name)
            self._spawn(self._restore(name, states[name], urls[name], http, redis))

    async def _restore(
        self, name: str, state: str, url: str, http: httpx.AsyncClient, redis: aioredis.Redis
    ) -> None:
        try:
            # the load record may lag a `ready` that did get through: the sidecar's own word first
            with contextlib.suppress(httpx.HTTPError, ValueError):
                status = (await http.get(f"{url}/prefixfleet/status")).json()
                if isinstance(status, dict) and status.get("state") == "ready":
                    self.left.discard(name)
                    return
            posted = await self._post_state(http, redis, name, url, "ready", None)
        finally:
            self.restoring.discard(name)
        if posted.ok:
            self.left.discard(name)
            self._event("state", f"{name}: its sidecar still said {state}; set ready")

    def view(self) -> FleetSnapshot:
        """The fleet as it is now (copies: what the autoscaler's tasks change later is not in it)."""
        return FleetSnapshot(
            tuple(self.fleet.replicas),
            self.starting,
            frozenset(self.draining),
            frozenset(self.warming),
            dict(self.created),
        )

    async def arrived_to(self, redis: aioredis.Redis) -> Sequence[ReplicaObservation]:
        """The replicas as a new one arrives (``autoscale_sources.replicas_now``)."""
        keys = FleetKeys(self.fleet.spec.fleet_name)
        return await replicas_now(redis, keys, self.view().pods(), self.observed)

    async def control_token(self, redis: aioredis.Redis) -> str:
        """The fleet's control token, which a sidecar's control routes require, read from the fleet's
        Redis at each warm-up or drain (a rotation, ``DEL pf:{fleet}:control``, holds for the next)."""
        return await fleet_control_token(redis, FleetKeys(self.fleet.spec.fleet_name))

    def _observed_replica(self, name: str, urls: Mapping[str, str]) -> Replica | None:
        """The fleet's replica ``name`` if it is still the process the round observed (same sidecar
        URL): during the round's awaits it may have been reaped and its index reused by a new
        replica, which no plan made on the old view may drain or warm."""
        url = urls.get(name)
        return next((r for r in self.fleet.replicas if r.worker_id == name and r.sidecar_url == url), None)

    async def execute(
        self,
        plan: ScalePlan,
        subtrees: Sequence[SubtreeObservation],
        urls: Mapping[str, str],
        http: httpx.AsyncClient,
        redis: aioredis.Redis,
    ) -> None:
        if plan.add:
            self._event("scale_up", plan.reason)
        new_warm = {w.target: w.subtree_ids for w in plan.prewarm if w.target.startswith("new-")}
        for i in range(plan.add):
            self.starting += 1
            self._spawn(self._add_replica(new_warm.get(f"new-{i}", ()), subtrees, http, redis))
        # Targets are resolved against the fleet now (this round's view is as old as its awaits); one
        # that is gone is skipped: the next round observes the fleet as it is.
        for warm in plan.prewarm:
            existing = not warm.target.startswith("new-") and self._observed_replica(warm.target, urls)
            # it keeps serving while it warms, so the next round may plan the same warm-up again
            if existing and warm.target not in self.prewarming:
                self.prewarming.add(warm.target)
                url, sids = urls[warm.target], warm.subtree_ids
                self._spawn(self._warm(warm.target, url, sids, subtrees, http, redis, new=False))
        for victim in plan.drain:
            replica = self._observed_replica(victim, urls)
            # (one being set ready again is left to a later round: its `ready` could land after the
            # drain's `draining` and put it back into rotation while it is stopped)
            if replica is not None and victim not in self.draining and victim not in self.restoring:
                self._event("scale_down", plan.reason)
                self.draining.add(victim)
                self.reserved.add(replica.index)  # (released by _drain) no new replica takes its name
                self._spawn(self._drain(replica, http, redis))

    async def _add_replica(
        self,
        subtree_ids: Sequence[str],
        subtrees: Sequence[SubtreeObservation],
        http: httpx.AsyncClient,
        redis: aioredis.Redis,
    ) -> None:
        index = max([r.index for r in self.fleet.replicas] + list(self.reserved), default=-1) + 1
        self.reserved.add(index)  # concurrent additions never share an index
        counted = True
        try:
            replica = await self.fleet.start_replica(index)
            assert replica.sidecar_url is not None
            self.created[replica.worker_id] = time.time()
            self.left.discard(replica.worker_id)  # a new sidecar starts ready: no mark of an old one's
            self.warming.add(replica.worker_id)
            # from here on it is observed as a replica (warming), no longer as one still starting
            self.fleet.add_replica(replica)
            self.starting -= 1
            counted = False
            # decided on arrival: a replica the fleet is already queueing for serves at once, cold
            if subtree_ids and warm_on_arrival(await self.arrived_to(redis), self.policy):
                url = replica.sidecar_url
                await self._warm(replica.worker_id, url, subtree_ids, subtrees, http, redis, new=True)
            elif subtree_ids:
                self._event("prewarm", f"{replica.worker_id}: skipped, a ready replica waits past saturation")
        finally:
            self.reserved.discard(index)
            if counted:
                self.starting -= 1
            else:  # (a failed warm-up too: else it would be observed as warming for good)
                self.warming.discard(replica.worker_id)

    async def _warm(
        self,
        name: str,
        url: str,
        subtree_ids: Sequence[str],
        subtrees: Sequence[SubtreeObservation],
        http: httpx.AsyncClient,
        redis: aioredis.Redis,
        *,
        new: bool,
    ) -> None:
        """Warm ``name`` from holders. A ``new`` replica takes no traffic until warmed; an existing
        one keeps serving meanwhile (its warm-up queues with its traffic, as in the simulator)."""
        if new:
            self.warming.add(name)
        token: str | None = None  # none: the token is unreadable, nothing was changed
        try:
            token = await self.control_token(redis)
            if new:  # no traffic until warmed; not set (said as an error), it serves cold meanwhile
                posted = await self._post_state(http, redis, name, url, "warming", token)
                token = posted.token
                if may_have_landed(posted):  # the loop's own mark, for `stranded` if `ready` fails
                    self.left.add(name)
            holders = {r.worker_id: r.sidecar_url for r in self.fleet.replicas if r.sidecar_url}
            live = {n: u for n, u in holders.items() if n not in self.draining and u is not None}
            outcome = await warm_replica(
                http, url, subtree_ids, subtrees, live, exclude=name, hold_traffic=new,
                timeout_s=lambda: WARM_TIMEOUT_S, control_token=token,
            )  # fmt: skip
        finally:
            self.prewarming.discard(name)
            if new:  # warmed or not, it serves from here on (a failed warm-up is said by the caller)
                try:
                    if token is not None:  # not set: said as an error; a later round sets it (stranded)
                        ready = await self._post_state(http, redis, name, url, "ready", token)
                        if ready.ok:
                            self.left.discard(name)
                finally:
                    self.warming.discard(name)
        self._event("prewarm", f"{name}: {outcome.warmed_tokens} tokens warmed, {outcome.failed} failed")

    async def _drain(self, replica: Replica, http: httpx.AsyncClient, redis: aioredis.Redis) -> None:
        # This replica, not whichever holds its name at the end: if it dies while draining, the
        # reaper takes it out, and its index stays reserved (by execute) so no new replica gets its
        # name meanwhile.
        name, url = replica.worker_id, replica.sidecar_url
        try:
            assert url is not None  # a replica joins the fleet once its sidecar answers
            # token unreadable: the drain fails before anything changed (said by _task_done); it serves
            posted = await self._post_state(http, redis, name, url, "draining", None)
            if may_have_landed(posted):  # the loop's own mark: undone by the ready below, gone with
                self.left.add(name)  # it, or by a later round (`stranded`) if the drain stops here
            # (said as an error by _post_state) it serves on; a later round may choose it again.
            # Unless it kept silent and no longer heartbeats: hung, it serves nobody (and has
            # nothing in flight worth waiting for)
            hung = not drain_goes_on(posted) and posted.silent and await self._unheard(redis, name)
            if not drain_goes_on(posted) and not hung:
                return
            token = posted.token
            self._event("drain", name)
            started = time.monotonic()
            while not hung and time.monotonic() - started < self.drain_timeout_s:
                await asyncio.sleep(0.25)
                if time.monotonic() - started < MIN_DRAIN_S:
                    continue
                try:
                    status = (await http.get(f"{url}/prefixfleet/status")).json()
                except (httpx.HTTPError, ValueError):
                    break
                if not in_flight(status):
                    break
            if replica in self.fleet.replicas:
                try:
                    await self.fleet.stop_replica(replica)
                except Exception:
                    # still in the fleet, so counted as serving from now on: it serves again too
                    # (gateways skip a draining sidecar); a later round may choose it again
                    # (not set: said as an error; a later round sets it, see `stranded`)
                    if (await self._post_state(http, redis, name, url, "ready", token)).ok:
                        self.left.discard(name)
                    raise
                with contextlib.suppress(ValueError):  # (the reaper may have taken it out meanwhile)
                    self.fleet.replicas.remove(replica)
        finally:
            # also when the stop fails: a name left in `draining` would be observed as draining for
            # good, and so would a later replica of the same name
            self.reserved.discard(replica.index)
            self.draining.discard(name)
            if replica not in self.fleet.replicas:  # gone (stopped, or reaped): no mark of ours left
                self.left.discard(name)
        self._event("removed", name)

    async def _unheard(self, redis: aioredis.Redis, name: str) -> bool:
        """:func:`heartbeat_stopped` for ``name``, its load record read twice; False when Redis does
        not say (then nothing is known: the replica is kept)."""
        key = FleetKeys(self.fleet.spec.fleet_name).load(name)
        try:
            before = await redis.get(key)
            await asyncio.sleep(HEARTBEAT_WATCH_S)
            after = await redis.get(key)
            stopped = heartbeat_stopped(
                decode_load(before) if before is not None else None,
                decode_load(after) if after is not None else None,
            )
        except (RedisError, OSError, SummaryError, ValueError):
            return False
        if stopped:
            self._event("state", f"{name}: its sidecar keeps silent and publishes no load: stopping it")
        return stopped

    async def _post_state(
        self,
        http: httpx.AsyncClient,
        redis: aioredis.Redis,
        name: str,
        url: str,
        state: str,
        token: str | None,
    ) -> StatePosted:
        """``POST {url}/prefixfleet/state {"state": state}`` with the control token (``token``; None:
        read it first), checked: retried as :func:`state_post_step` says; a failure is an ``error``
        event naming the replica, the state and the sidecar's last answer. Never raises for the
        sidecar's answer; a token that cannot be read again raises (RedisError, OSError)."""
        if token is None:
            token = await self.control_token(redis)
        answer = ""
        for attempt in range(STATE_POST_ATTEMPTS):
            status: int | None
            silent = False
            try:
                resp = await http.post(
                    f"{url}/prefixfleet/state", json={"state": state}, headers=control_headers(token)
                )
                status, answer = resp.status_code, f"HTTP {resp.status_code} {resp.text.strip()[:200]}"
            except httpx.HTTPError as exc:
                silent = isinstance(exc, httpx.TimeoutException)
                status, answer = None, f"no answer ({exc.__class__.__name__}: {exc})"[:300]
            step = state_post_step(status, attempt, silent=silent)
            if step is PostStep.DONE:
                return StatePosted(True, token, status, answer)
            if step is PostStep.GIVE_UP:
                break
            changed = False
            if step is PostStep.REREAD:
                fresh = await self.control_token(redis)
                changed, token = fresh != token, fresh
            await asyncio.sleep(retry_pause_s(step, attempt, changed))
        self._event("error", f"{name}: state {state} not set after {attempt + 1} attempt(s): {answer}")
        return StatePosted(False, token, status, answer, silent)
