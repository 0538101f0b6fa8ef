"""Fault experiments on a local fleet of real processes, each returning a JSON-able report.

Every scenario starts its own fleet (embedded Redis, emulated engines behind sidecars, gateways) in
``run_dir`` under a :class:`~prefixfleet.fleet.processes.Supervisor`, drives fixed-rate traffic
through the gateways (:mod:`.traffic`), injects one fault at a set time, and reports what every
request saw plus how long the fleet took to recover. Everything it started is stopped on return,
on error and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet
from prefixfleet.fleet.processes import LOOPBACK, Child, RedisEndpoint, Supervisor, redis_ready
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.policies import DEFAULT_POLICY

from .procstats import mib, rss_bytes
from .traffic import Outcome, TrafficPlan, TrafficRun, achieved_rate, drive, tally

Tick = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class ChaosFleet:
    replicas: int = 4
    gateways: int = 2
    time_scale: float = 4.0
    cache_tokens: int = 40_000
    policy: str = DEFAULT_POLICY

    def spec(self) -> FleetSpec:
        engine = EngineSettings(time_scale=self.time_scale, cache_tokens=self.cache_tokens)
        return FleetSpec(replicas=self.replicas, gateways=self.gateways, engine=engine, fleet_name="chaos")


@contextlib.asynccontextmanager
async def running_fleet(run_dir: Path, fleet: ChaosFleet):  # -> AsyncIterator[LocalFleet]
    async with Supervisor(run_dir) as sup:
        local = LocalFleet(sup, fleet.spec())
        await local.start_engines()
        await local.start_gateways(fleet.policy)
        yield local


def crash(child: Child) -> None:
    """SIGKILL a child's process group: no cleanup, no deregistration (a node or OOM kill)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


def _phase(outcomes: list[Outcome], start: float, end: float) -> dict[str, Any]:
    return tally([o for o in outcomes if start <= o.sent_at < end])


# -- kill one engine (and its sidecar) -------------------------------------------------------------


class _Clock:
    """Seconds since the traffic started (set just before :func:`drive` starts sending)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def start(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - self.now()))


async def _with_fault(
    local: LocalFleet, plan: TrafficPlan, fault: Callable[[_Clock], Any], on_tick: Tick | None
) -> TrafficRun:
    """Run the traffic and, concurrently, the ``fault(clock)`` coroutine (it must not outlive a
    bounded time after the traffic ends)."""
    clock = _Clock()
    clock.start()
    task = asyncio.create_task(fault(clock))
    try:
        run = await drive(local.gateway_urls, plan, on_tick=on_tick)
        await asyncio.wait_for(task, timeout=120)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return run


async def engine_kill(
    run_dir: Path,
    plan: TrafficPlan,
    fleet: ChaosFleet = ChaosFleet(),
    *,
    kill_at_s: float | None = None,
    on_tick: Tick | None = None,
) -> dict[str, Any]:
    """Kill replica 0's engine and sidecar at ``kill_at_s`` (default: a third into the run)."""
    kill_at = plan.duration_s / 3 if kill_at_s is None else kill_at_s
    events: dict[str, float] = {}
    async with running_fleet(run_dir, fleet) as local:
        victim = local.replicas[0]

        async def fault(clock: _Clock) -> None:
            await clock.until(kill_at)
            assert victim.sidecar is not None
            crash(victim.engine)
            crash(victim.sidecar)
            events["killed"] = clock.now()

        run = await _with_fault(local, plan, fault, on_tick)
        killed = events.get("killed", 1e9)
        late = sum(1 for o in run.outcomes if o.sent_at > killed + 1 and o.worker == victim.worker_id)
        report = {
            "scenario": "engine-kill",
            "fleet": asdict(fleet),
            "plan": asdict(plan),
            "killed_worker": victim.worker_id,
            "killed_at_s": events.get("killed"),
            "overall": tally(run.outcomes),
            "after_kill": _phase(run.outcomes, killed, 1e9),
            "answered_by_dead_worker_1s_after_kill": late,
            "retries_by_gateways": await _gateway_metric_sum(
                local.gateway_urls, "prefixfleet_gateway_retries_total"
            ),
        }
    return report


async def _gateway_metric_sum(urls: list[str], name: str) -> float:
    total = 0.0
    async with aiohttp.ClientSession() as session:
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    for line in (await r.text()).splitlines():
                        if line.startswith(name) and not line.startswith("#"):
                            total += float(line.rsplit(" ", 1)[1])
    return total


# -- stop Redis, restart it --------------------------------------------------------------------------


async def restart_redis(sup: Supervisor, endpoint: RedisEndpoint) -> RedisEndpoint:
    """Start a fresh, empty server with the same argv (same port) as ``endpoint``."""

    async def ready() -> bool:
        return await redis_ready(LOOPBACK, endpoint.port)

    child = await sup.start("redis-restarted", endpoint.child.argv, ready=ready, url=endpoint.url)
    return RedisEndpoint(endpoint.url, endpoint.port, child)


async def _fleet_recovered(local: LocalFleet, client: aioredis.Redis, since_s: float) -> dict[str, bool]:
    """Which parts are back ``since_s`` after the new server was started: member records, summaries
    in Redis, and every gateway reading Redis again with each worker routable on a summary written
    since."""
    keys = FleetKeys(local.spec.fleet_name)
    want = [r.worker_id for r in local.replicas]
    out = {"membership": False, "summaries": False, "gateways": False}
    with contextlib.suppress(aioredis.RedisError, OSError, TimeoutError):
        members = await client.hkeys(keys.members)
        out["membership"] = len(members) == len(want)
        out["summaries"] = await client.exists(*[keys.summary(w) for w in want]) == len(want)
    ok = True
    async with aiohttp.ClientSession() as session:
        for url in local.gateway_urls:
            try:
                async with session.get(
                    f"{url}/prefixfleet/view", timeout=aiohttp.ClientTimeout(total=1)
                ) as r:
                    view = await r.json()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                ok = False
                continue
            workers = view["workers"]
            ok = ok and bool(view["redis_ok"]) and len(workers) == len(want)
            ok = ok and all(
                w["routable"] and w["summary_age_s"] is not None and w["summary_age_s"] <= since_s
                for w in workers
            )
    out["gateways"] = ok
    return out


def redis_stop_at(duration_s: float) -> float:
    """When ``redis_outage`` stops Redis by default: a fifth into the traffic, so a baseline comes first."""
    return duration_s / 5


RECOVERY_WAIT_S = 60.0  # redis-outage: how long after the restart recovery is waited for


async def redis_outage(
    run_dir: Path,
    plan: TrafficPlan,
    fleet: ChaosFleet = ChaosFleet(),
    *,
    outage_s: float = 30.0,
    stop_at_s: float | None = None,
    recovery_wait_s: float = RECOVERY_WAIT_S,
    on_tick: Tick | None = None,
) -> dict[str, Any]:
    """Stop Redis at ``stop_at_s`` for ``outage_s``, restart it empty, measure recovery (each part
    not recovered within ``recovery_wait_s`` of the restart is reported as None)."""
    stop_at = redis_stop_at(plan.duration_s) if stop_at_s is None else stop_at_s
    events: dict[str, float] = {}
    recovered: dict[str, float] = {}
    async with running_fleet(run_dir, fleet) as local:
        assert local.redis is not None
        endpoint = local.redis
        client = aioredis.from_url(endpoint.url, socket_timeout=0.5, socket_connect_timeout=0.5)

        async def fault(clock: _Clock) -> None:
            await clock.until(stop_at)
            await local.sup.stop(endpoint.child)
            events["stopped"] = clock.now()
            await clock.until(events["stopped"] + outage_s)
            # Sidecars reconnect as soon as the new server answers, which on a loaded machine can be
            # a while before its readiness is seen here: a summary written in that gap is fresh.
            events["restarting"] = clock.now()
            await restart_redis(local.sup, endpoint)
            events["restarted"] = clock.now()
            # a deadline in seconds, not a count of polls: each poll's Redis and HTTP reads take
            # longer on a loaded machine, and a count of 600 "0.1 s" polls then ran for minutes
            give_up = events["restarted"] + recovery_wait_s
            while True:
                status = await _fleet_recovered(local, client, clock.now() - events["restarting"])
                for what, done in status.items():
                    if done and what not in recovered:
                        recovered[what] = round(clock.now() - events["restarted"], 3)
                if len(recovered) == len(status) or clock.now() >= give_up:
                    return
                await asyncio.sleep(0.1)

        try:
            run = await _with_fault(local, plan, fault, on_tick)
        finally:
            await client.aclose()
        stopped, restarted = events.get("stopped", 0.0), events.get("restarted", 1e9)
        report = {
            "scenario": "redis-outage",
            "fleet": asdict(fleet),
            "plan": asdict(plan),
            "outage_s": outage_s,
            "redis_stopped_at_s": events.get("stopped"),
            "redis_restarted_at_s": events.get("restarted"),
            "overall": tally(run.outcomes),
            "before_outage": _phase(run.outcomes, 0.0, stopped),
            "during_outage": _phase(run.outcomes, stopped, restarted),
            "after_restart": _phase(run.outcomes, restarted, 1e9),
            "recovery_s": {
                "membership": recovered.get("membership"),
                "summaries": recovered.get("summaries"),
                "gateway_views": recovered.get("gateways"),
            },
            "gateway_redis_warnings": [_count(c.log_path, "redis unavailable") for c in local.gateways],
        }
    return report


def _count(path: Path, needle: str) -> int:
    try:
        return path.read_text(errors="replace").count(needle)
    except OSError:
        return 0


# -- kill one of two gateways --------------------------------------------------------------------------


async def gateway_kill(
    run_dir: Path,
    plan: TrafficPlan,
    fleet: ChaosFleet = ChaosFleet(),
    *,
    kill_at_s: float | None = None,
    on_tick: Tick | None = None,
) -> dict[str, Any]:
    """SIGKILL the second gateway at ``kill_at_s``; the client alternates gateways and retries on
    connection errors (``plan.client_retries``, at least 1)."""
    if fleet.gateways < 2:
        raise ValueError("gateway-kill needs at least 2 gateways")
    plan = replace(plan, client_retries=max(plan.client_retries, 1))
    kill_at = plan.duration_s / 3 if kill_at_s is None else kill_at_s
    events: dict[str, float] = {}
    async with running_fleet(run_dir, fleet) as local:
        victim = local.gateways[-1]
        survivor_urls = local.gateway_urls[:-1]

        async def fault(clock: _Clock) -> None:
            await clock.until(kill_at)
            crash(victim)
            events["killed"] = clock.now()

        run = await _with_fault(local, plan, fault, on_tick)
        killed = events.get("killed", 1e9)
        after = [o for o in run.outcomes if o.sent_at >= killed]
        report = {
            "scenario": "gateway-kill",
            "fleet": asdict(fleet),
            "plan": asdict(plan),
            "killed_gateway": victim.url,
            "killed_at_s": events.get("killed"),
            "overall": tally(run.outcomes),
            "after_kill": tally(after),
            "after_kill_through_survivor": tally([o for o in after if o.first_gateway in survivor_urls]),
            "after_kill_aimed_at_dead_gateway": tally([o for o in after if o.first_gateway == victim.url]),
            "recovered_by_client_retry": sum(1 for o in run.outcomes if o.attempts > 1 and o.ok),
        }
    return report


# -- soak: a fixed rate for a long time, memory sampled ------------------------------------------------


async def soak(
    run_dir: Path,
    plan: TrafficPlan,
    fleet: ChaosFleet = ChaosFleet(gateways=1),
    *,
    sample_every_s: float = 1.0,
    on_tick: Tick | None = None,
) -> dict[str, Any]:
    """Hold ``plan``'s rate with every request on a fresh prefix (the worst case for any index)
    and sample the resident memory of the gateway(s) and sidecars."""
    samples: list[dict[str, Any]] = []
    async with running_fleet(run_dir, fleet) as local:
        gateways = list(local.gateways)
        sidecars = [r.sidecar for r in local.replicas if r.sidecar is not None]
        next_sample = [0.0]

        def sample(elapsed: float) -> None:
            samples.append(
                {
                    "t_s": round(elapsed, 2),
                    "gateway_rss_mib": [mib(rss_bytes(g.pid)) for g in gateways],
                    "sidecar_rss_mib": [mib(rss_bytes(s.pid)) for s in sidecars],
                }
            )

        def tick(elapsed: float) -> None:
            if on_tick:
                on_tick(elapsed)
            if elapsed >= next_sample[0]:
                sample(elapsed)
                next_sample[0] = elapsed + sample_every_s

        run = await drive(local.gateway_urls, plan, on_tick=tick)
        sample(run.wall_s)
        overlay = await _overlay_sizes(local.gateway_urls)
    gw = [s["gateway_rss_mib"][0] for s in samples if s["gateway_rss_mib"] and s["gateway_rss_mib"][0]]
    sc = [max(x for x in s["sidecar_rss_mib"] if x) for s in samples if any(s["sidecar_rss_mib"])]
    result = tally(run.outcomes)
    achieved = achieved_rate(run.outcomes)  # measured from the start times, not requests / --duration
    return {
        "scenario": "soak",
        "fleet": asdict(fleet),
        "plan": asdict(plan),
        "overall": result,
        "achieved_rate_per_s": None if achieved is None else round(achieved, 2),
        "gateway_rss_mib": {
            "start": gw[0] if gw else None,
            "end": gw[-1] if gw else None,
            "max": max(gw) if gw else None,
            "growth_last_half": round(gw[-1] - gw[len(gw) // 2], 1) if len(gw) > 1 else None,
        },
        "sidecar_rss_mib_max": max(sc) if sc else None,
        "gateway_overlay_blocks_at_end": overlay,
        "samples": samples,
    }


async def _overlay_sizes(urls: list[str]) -> list[int]:
    out = []
    async with aiohttp.ClientSession() as session:
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, KeyError, ValueError):
                async with session.get(
                    f"{url}/prefixfleet/view", timeout=aiohttp.ClientTimeout(total=2)
                ) as r:
                    out.append(sum(w["overlay_blocks"] for w in (await r.json())["workers"]))
    return out
