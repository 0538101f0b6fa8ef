"""A replica killed hard in a running local fleet (real Valkey, emulators, sidecars, a gateway).

Specification:
* without the autoscaler: SIGKILL one sidecar under steady traffic; its member leaves Redis, so the
  gateway counts one worker fewer; then the replica is restarted under the same name and the gateway
  routes to it again. Killed again right away, it stays down. Only requests in flight at a kill may
  fail; every process is stopped at the end;
* with the autoscaler (minReplicas = the fleet's size): the reaper only removes the member, and the
  planner's below-minReplicas branch adds a replica, which becomes routable;
* ``deregister_worker`` (the sidecar's way out, which the reaper takes on a dead one's behalf)
  removes that worker's member entry, load record and summary and announces ``left <id>``, leaving
  the other workers' keys alone; with ``member=False`` (operator-owned membership) the entry stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import RedisServer, eventually, live_children

from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.fleet.reaper import ReplicaReaper
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.router.keys import FleetKeys, deregister_worker

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
ENGINE = EngineSettings(cache_tokens=20_000, prefill_tokens_per_s=50_000, time_scale=4.0)
# Bounds of the waits on the fleet's own pace (a replica restart is two process start-ups, the
# gateway's view a refresh or two): generous, as a loaded machine slows them many times over.
SETTLE_S = 60.0
# The restart window the test runs the reaper with: its second kill must land inside it, after
# waits that take a few seconds normally and may take many times that under load (the default 10 s
# window let a slow run restart the replica a second time).
WINDOW_S = 600.0


@dataclass
class Traffic:
    """Two clients sending short requests one after another through the gateway."""

    gateway: str
    answers: list[tuple[int, str]] = field(default_factory=list)  # (status, worker); 0: no answer
    in_flight: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, clients: int = 2) -> None:
        await asyncio.gather(*(self._client(c) for c in range(clients)))

    async def _client(self, c: int) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            for i in range(100_000):
                if self.stop.is_set():
                    return
                body = {
                    "text": f"client {c} request {i}: say hello",
                    "sampling_params": {"max_new_tokens": 1},
                }
                self.in_flight += 1
                try:
                    resp = await http.post(f"{self.gateway}/generate", json=body)
                    self.answers.append((resp.status_code, resp.headers.get("X-Prefixfleet-Worker", "")))
                except httpx.HTTPError:
                    self.answers.append((0, ""))
                finally:
                    self.in_flight -= 1
                await asyncio.sleep(0.02)

    def failures(self) -> int:
        return sum(1 for status, _ in self.answers if status != 200)


async def gateway_counts(http: httpx.AsyncClient, gateway: str) -> tuple[int, int]:
    """(workers, routable_workers) from the gateway's /health (503 still carries the JSON)."""
    body = (await http.get(f"{gateway}/health")).json()
    return body["workers"], body["routable_workers"]


async def watch_counts(gateway: str, seen: list[tuple[int, int]], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        while not stop.is_set():
            counts = await gateway_counts(http, gateway)
            if not seen or seen[-1] != counts:
                seen.append(counts)
            await asyncio.sleep(0.03)


@contextlib.asynccontextmanager
async def two_replica_fleet(tmp_path: Path, policy: str) -> AsyncIterator[tuple[Supervisor, LocalFleet, str]]:
    """Two replicas behind one gateway routing with ``policy``: (supervisor, fleet, gateway URL).
    Every process is stopped when the block ends."""
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=2, gateways=1, engine=ENGINE))
        await fleet.start_engines()
        await fleet.start_gateways(policy)
        yield sup, fleet, fleet.gateway_urls[0]


async def member_url(fleet: LocalFleet, worker_id: str) -> str | None:
    client = aioredis.from_url(fleet.redis_url)
    try:
        raw = await client.hget(FleetKeys(fleet.spec.fleet_name).members, worker_id)
    finally:
        await client.aclose()
    return None if raw is None else json.loads(raw)["url"]


async def test_a_killed_sidecar_leaves_membership_and_its_replica_restarts_once(tmp_path: Path) -> None:
    lines: list[str] = []
    async with two_replica_fleet(tmp_path, "round_robin") as (sup, fleet, gateway):
        reaper = ReplicaReaper(fleet, restart=True, say=lines.append, window_s=WINDOW_S)
        traffic = Traffic(gateway)
        seen: list[tuple[int, int]] = []
        stop_watch = asyncio.Event()
        async with reaper.running():
            load = asyncio.create_task(traffic.run())
            watch = asyncio.create_task(watch_counts(gateway, seen, stop_watch))
            await eventually(
                lambda: {w for _, w in traffic.answers} >= {"replica-0", "replica-1"}, SETTLE_S, "traffic"
            )
            victim = fleet.replicas[1]
            assert victim.sidecar is not None and victim.worker_id == "replica-1"
            old_url = victim.sidecar_url
            in_flight_at_kills = traffic.in_flight
            os.kill(victim.sidecar.pid, signal.SIGKILL)
            await eventually(lambda: reaper.restarts == 1, SETTLE_S, "the restart")
            await eventually(lambda: seen[-1] == (2, 2), SETTLE_S, "the gateway to route to two again")
            served_after = len(traffic.answers)
            await eventually(
                lambda: any(w == "replica-1" for _, w in traffic.answers[served_after:]),
                SETTLE_S,
                "a request served by the restarted replica",
            )
            seen_first = list(seen)
            restarted = fleet.replicas[1]
            restarted_member = await member_url(fleet, "replica-1")
            sup.check_alive()  # the fleet itself is healthy: nothing left dead in it

            # killed again well within the restart window: it stays down
            assert restarted.sidecar is not None
            in_flight_at_kills += traffic.in_flight
            os.kill(restarted.sidecar.pid, signal.SIGKILL)
            await eventually(lambda: reaper.reaped == 2, SETTLE_S, "the second reaping")
            await eventually(lambda: seen[-1] == (1, 1), SETTLE_S, "the gateway to count one worker")
            # a few more requests, all sent once the gateway counted one worker (a fixed 1 s sleep
            # here could end before any answer came back on a loaded machine)
            counted_out = len(traffic.answers)
            await eventually(
                lambda: len(traffic.answers) >= counted_out + 4, SETTLE_S, "4 answers after the count"
            )
            traffic.stop.set()
            stop_watch.set()
            await asyncio.gather(load, watch)
            final_member = await member_url(fleet, "replica-1")
            sup.check_alive()
        assert lines[0] == (
            "replica-1: sidecar exited with code -9 (SIGKILL); removed from membership; restarting it"
        )
        assert lines[1].startswith("replica-1: restarted")
        assert re.fullmatch(
            r"replica-1: sidecar exited with code -9 \(SIGKILL\); removed from membership; "
            rf"not restarted again: it died \d+\.\ds after its restart \(within {WINDOW_S:g}s\)",
            lines[2],
        ), lines
        assert [e.action for e in reaper.events] == ["reaped", "restarted", "reaped"]
        assert reaper.restarts == 1
        # the gateway counted the member out before the restarted one came back
        assert seen_first[0] == (2, 2) and (1, 1) in seen_first and seen_first[-1] == (2, 2), seen
        assert restarted_member == restarted.sidecar_url != old_url
        assert [r.worker_id for r in fleet.replicas] == ["replica-0"] and final_member is None
        # only requests in flight when a sidecar died may have failed
        assert traffic.failures() <= in_flight_at_kills, (in_flight_at_kills, traffic.failures())
        assert traffic.answers[-1] == (200, "replica-0")
    assert live_children() == []


async def test_with_the_autoscaler_a_dead_replica_is_replaced_by_the_planner(tmp_path: Path) -> None:
    lines: list[str] = []
    async with two_replica_fleet(tmp_path, "queue_aware") as (_sup, fleet, gateway):
        reaper = ReplicaReaper(fleet, restart=False, say=lines.append)
        autoscaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=2, max_replicas=3), interval_s=0.5)
        stop_scaler = asyncio.Event()
        async with reaper.running():
            scaler = asyncio.create_task(autoscaler.run(stop_scaler))
            victim = fleet.replicas[1]
            assert victim.sidecar is not None
            os.kill(victim.sidecar.pid, signal.SIGKILL)
            await eventually(lambda: reaper.reaped == 1, SETTLE_S, "the reaper")
            await eventually(
                lambda: any(e.action == "scale_up" for e in autoscaler.events), SETTLE_S, "a scale-up"
            )
            async with httpx.AsyncClient(timeout=30) as http:
                counts: list[tuple[int, int]] = []

                async def refresh() -> tuple[tuple[int, int], int]:
                    counts.append(await gateway_counts(http, gateway))
                    return counts[-1], len(fleet.replicas)

                # the new replica is two process start-ups away: wait on it (a 200-poll loop was
                # ~20 s on a quiet machine, less than that start-up may take under load)
                wanted = ((2, 2), 2)  # (workers, routable) at the gateway, replicas in the fleet
                await eventually(refresh, SETTLE_S, "the new replica to be routable", done=wanted.__eq__)
            stop_scaler.set()
            await scaler
        assert lines == [
            "replica-1: sidecar exited with code -9 (SIGKILL); removed from membership; "
            "not restarted: the autoscaler replaces replicas"
        ]
        assert reaper.restarts == 0
        scale_ups = [e.detail for e in autoscaler.events if e.action == "scale_up"]
        # exactly one: a round once counted a replica that finished starting mid-round in neither the
        # fleet nor `starting` and scaled up again (tests/test_local_autoscaler_round_snapshot.py)
        assert scale_ups == ["below minReplicas (1 < 2)"], autoscaler.events
        assert counts[-1] == (2, 2) and len(fleet.replicas) == 2, counts
    assert live_children() == []


@pytest.mark.timeout(30)
async def test_deregister_worker_removes_only_that_workers_keys(redis_server: RedisServer) -> None:
    keys = FleetKeys("leave")
    client = aioredis.from_url(redis_server.url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        for w in ("w0", "w1", "w2"):
            await client.hset(keys.members, w, "{}")
            await client.set(keys.load(w), "{}")
            await client.set(keys.summary(w), b"summary")
        await pubsub.subscribe(keys.events)
        await deregister_worker(client, keys, "w0")
        await deregister_worker(client, keys, "w2", member=False)
        notices = []
        for _ in range(50):  # bounded: ~5 s
            message = await pubsub.get_message(timeout=0.1)
            if message is not None:
                notices.append(message["data"])
            if len(notices) == 2:
                break
        assert notices == [b"left w0", b"left w2"]
        assert sorted(await client.hkeys(keys.members)) == [b"w1", b"w2"]
        assert await client.exists(keys.load("w0"), keys.summary("w0")) == 0
        assert await client.exists(keys.load("w2"), keys.summary("w2")) == 0
        assert await client.exists(keys.load("w1"), keys.summary("w1")) == 2
    finally:
        await pubsub.aclose()
        await client.aclose()
