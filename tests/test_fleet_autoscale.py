"""The autoscaler's loop on the local fleet (real processes: Valkey, emulators, sidecars, a gateway).

Specification (one replica allowed to grow to two, short intervals):
* a burst on one long prefix makes the loop start a second replica, pre-warmed with that prefix from
  the holder: its first requests routed by the gateway are cache hits on the whole prefix;
* after the burst the loop drains the replica the planner names and stops its processes; no request
  fails meanwhile and the fleet is back to one replica;
* a new replica that arrives while a ready one waits past saturation (0.7 × the TTFT target, read
  from the load records as it arrives, not from the last round) skips its planned warm-up and
  serves at once: no warm request, state ``ready``, event ``prewarm <replica>: skipped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import eventually

from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet, Replica
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.operator.autoscale import Prewarm, ScalePlan, ScalePolicy
from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_load
from prefixfleet.tokenizer import tokenize

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
PREFIX = "You are the support agent of the local autoscaling tenant; follow the handbook closely. " * 60
PREFIX_TOKENS = len(tokenize(PREFIX)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS
POLICY = ScalePolicy(
    min_replicas=1, max_replicas=2, target_ttft_s=1.0, scale_up_cooldown_s=0, scale_down_stabilization_s=3,
    hot_rate_rps=0.2, prewarm_subtrees=2, target_load=0.5, scale_down_load=0.2, lead_time_s=0,
)  # fmt: skip


async def send(
    http: httpx.AsyncClient, gateway: str, tag: str, words: int, answers: list[tuple[int, str, int]]
) -> None:
    tail = " ".join(f"{tag}w{j}" for j in range(words))
    body = {"text": PREFIX + tail, "sampling_params": {"max_new_tokens": 1}}
    try:
        resp = await http.post(f"{gateway}/generate", json=body)
        cached = resp.json()["meta_info"]["cached_tokens"] if resp.status_code == 200 else -1
        answers.append((resp.status_code, resp.headers.get("X-Prefixfleet-Worker", ""), cached))
    except httpx.HTTPError:
        answers.append((0, "", -1))


async def clients(gateway: str, n: int, words: int, pause_s: float, stop: asyncio.Event,
                  answers: list[tuple[int, str, int]]) -> None:  # fmt: skip
    async def client(c: int) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(10_000):
                if stop.is_set():
                    return
                await send(http, gateway, f"c{c}x{i}", words, answers)
                if pause_s:
                    await asyncio.sleep(pause_s)

    await asyncio.gather(*(client(c) for c in range(n)))


async def test_local_fleet_scales_up_prewarmed_and_back_down(tmp_path: Path) -> None:
    engine = EngineSettings(cache_tokens=60_000, prefill_tokens_per_s=4000)
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=1, engine=engine))
        await fleet.start_engines()
        await fleet.start_gateways("queue_aware")
        gateway = fleet.gateway_urls[0]
        autoscaler = LocalAutoscaler(fleet, POLICY, interval_s=1.0)
        stop_scaler = asyncio.Event()
        scaler = asyncio.create_task(autoscaler.run(stop_scaler))
        actions = lambda: [e.action for e in autoscaler.events]  # noqa: E731
        try:
            burst: list[tuple[int, str, int]] = []
            stop_burst = asyncio.Event()
            load = asyncio.create_task(clients(gateway, 4, 60, 0.0, stop_burst, burst))
            await eventually(lambda: "prewarm" in actions(), 60, "a pre-warmed second replica")
            await eventually(lambda: sum(1 for a in burst if a[1] == "replica-1") >= 3, 60,
                             "requests routed to the new replica")  # fmt: skip
            stop_burst.set()
            await load
            assert all(status == 200 for status, _, _ in burst), [a for a in burst if a[0] != 200][:5]
            on_new = [cached for _, worker, cached in burst if worker == "replica-1"]
            assert all(c >= PREFIX_TOKENS for c in on_new[:3]), (on_new[:10], PREFIX_TOKENS)
            warm = next(e for e in autoscaler.events if e.action == "prewarm")
            assert warm.detail.startswith("replica-1:") and warm.detail.endswith(" 0 failed")

            light: list[tuple[int, str, int]] = []
            stop_light = asyncio.Event()
            trickle = asyncio.create_task(clients(gateway, 1, 5, 0.3, stop_light, light))
            await eventually(lambda: "removed" in actions(), 60, "the scale-down to finish")
            # an answer to a request sent after the removal (a fixed 0.5 s sleep here might see none
            # come back on a loaded machine; the trickle pauses 0.3 s between requests)
            removed_at = len(light)
            await eventually(lambda: len(light) >= removed_at + 2, 30, "2 answers after the removal")
            stop_light.set()
            await trickle
            down = next(e for e in autoscaler.events if e.action == "scale_down")
            named = re.search(r"drain (\S+)$", down.detail)
            assert named, down.detail
            removed = next(e for e in autoscaler.events if e.action == "removed")
            assert removed.detail == named.group(1)
            assert [r.worker_id for r in fleet.replicas] == [
                w for w in ("replica-0", "replica-1") if w != removed.detail
            ]
            assert light and all(status == 200 for status, _, _ in light), light
        finally:
            stop_scaler.set()
            await scaler


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "3", "--max-replicas", "2"], "--replicas (3) <= --max-replicas (2)"),
        (["--replicas", "1", "--min-replicas", "2"], "--min-replicas (2) <= --replicas (1)"),
        (["--autoscale-interval", "0"], "--autoscale-interval"),
    ],
)
def test_up_autoscale_refuses_bad_bounds_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefixfleet.cli import main

    assert main(["up", "--autoscale", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


SLOW_ENGINE = EngineSettings(cache_tokens=60_000, prefill_tokens_per_s=500)


async def recorded_wait_s(redis_url: str, fleet_name: str, worker: str) -> float:
    """The wait a replica's load record in Redis shows (pending prefill tokens / prefill speed)."""
    async with aioredis.from_url(redis_url) as client:
        raw = await client.get(FleetKeys(fleet_name).load(worker))
    load = decode_load(raw) if raw is not None else None
    speed = load.prefill_tokens_per_s if load is not None else 0.0
    return load.pending_prefill_tokens / speed if load is not None and speed > 0 else 0.0


@contextlib.asynccontextmanager
async def saturated(fleet: LocalFleet, replica: Replica, policy: ScalePolicy) -> AsyncIterator[None]:
    """``replica`` with three unique 1000-token prompts queued (6 s of prefill on SLOW_ENGINE), from
    the moment its load record shows a wait past saturation until the block ends (then cancelled).
    Each answered prompt is replaced by a new one, so the replica stays saturated however long the
    block takes: three prompts alone drained in 6 s, before a replica starting on a loaded machine
    arrived, and the test then saw a calm fleet."""
    worker, past = replica.worker_id, policy.saturation * policy.target_ttft_s
    async with httpx.AsyncClient(timeout=60) as http:
        url = f"{replica.sidecar_url}/generate"
        body = {"sampling_params": {"max_new_tokens": 1}}

        async def prompt(i: int) -> None:
            await http.post(url, json={**body, "text": " ".join(f"q{i}w{j}" for j in range(1000))})

        async def keep_three_queued() -> None:
            queued = {asyncio.create_task(prompt(i)) for i in range(3)}
            sent = len(queued)
            try:
                while True:
                    answered, queued = await asyncio.wait(queued, return_when=asyncio.FIRST_COMPLETED)
                    for _ in answered:
                        queued.add(asyncio.create_task(prompt(sent)))
                        sent += 1
            finally:
                for task in queued:
                    task.cancel()
                await asyncio.gather(*queued, return_exceptions=True)

        feeder = asyncio.create_task(keep_three_queued())
        try:
            await eventually(
                lambda: recorded_wait_s(fleet.redis_url, fleet.spec.fleet_name, worker), 15,
                f"{worker}'s load record to show a wait past {past} s", done=lambda wait: wait > past,
            )  # fmt: skip
            yield
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)


@contextlib.asynccontextmanager
async def one_replica(
    tmp_path: Path,
) -> AsyncIterator[tuple[LocalFleet, LocalAutoscaler, Replica, aioredis.Redis, httpx.AsyncClient]]:
    """A one-replica local fleet on SLOW_ENGINE with its autoscaler, a Redis client and an HTTP client."""
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=0, engine=SLOW_ENGINE))
        await fleet.start_engines()
        (replica,) = fleet.replicas
        async with aioredis.from_url(fleet.redis_url) as redis, httpx.AsyncClient(timeout=30) as http:
            yield fleet, LocalAutoscaler(fleet, POLICY), replica, redis, http


async def test_a_replica_arriving_to_a_saturated_fleet_skips_its_warm_up(tmp_path: Path) -> None:
    async with one_replica(tmp_path) as (fleet, autoscaler, holder, redis, http):
        calm = await autoscaler.round(redis, http)  # the last round saw an idle fleet: nothing to do
        assert calm.is_noop and autoscaler.observed is not None
        async with saturated(fleet, holder, POLICY):
            # a plan made a start-up earlier: one replica, pre-warmed with a (hot) subtree
            warm = Prewarm("new-0", ("00000000c0ffee00",))
            plan = ScalePlan(desired_replicas=2, add=1, prewarm=(warm,), reason="test: scale up by 1")
            await autoscaler.execute(plan, (), {holder.worker_id: holder.sidecar_url or ""}, http, redis)
            await asyncio.wait_for(asyncio.gather(*autoscaler.tasks), 60)
            new = next(r for r in fleet.replicas if r.worker_id == "replica-1")
            state = (await http.get(f"{new.sidecar_url}/prefixfleet/status")).json()["state"]
    warm_ups = [e.detail for e in autoscaler.events if e.action == "prewarm"]
    # decided on the load records as it arrived (the last round's view said warm): no warm request
    assert warm_ups == ["replica-1: skipped, a ready replica waits past saturation"], autoscaler.events
    assert state == "ready" and not autoscaler.warming


async def test_an_existing_replica_gets_one_warm_up_at_a_time(tmp_path: Path) -> None:
    async with one_replica(tmp_path) as (_, autoscaler, replica, redis, http):
        urls = {replica.worker_id: replica.sidecar_url or ""}
        warm = Prewarm(replica.worker_id, ("00000000c0ffee00",))
        plan = ScalePlan(desired_replicas=1, prewarm=(warm,), reason="test: warm")
        # it keeps serving while it warms, so the next round may plan the same warm-up before it ends
        await autoscaler.execute(plan, (), urls, http, redis)
        await autoscaler.execute(plan, (), urls, http, redis)
        await asyncio.wait_for(asyncio.gather(*autoscaler.tasks), 60)
        assert not autoscaler.prewarming
        await autoscaler.execute(plan, (), urls, http, redis)  # once it ended, a new one may start
        await asyncio.wait_for(asyncio.gather(*autoscaler.tasks), 60)
    warm_ups = [e.detail for e in autoscaler.events if e.action == "prewarm"]
    assert len(warm_ups) == 2 and all(w.startswith(f"{replica.worker_id}: ") for w in warm_ups), warm_ups
