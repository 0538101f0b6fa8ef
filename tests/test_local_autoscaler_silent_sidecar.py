"""A sidecar that takes the connection and never answers costs one state post, not four.

``prefixfleet up --autoscale`` retries a state post that got no answer (0.25/0.5/1 s pauses), for a
sidecar restarting its listener or a Redis blip: those fail at once. A sidecar that accepts and then
says nothing (hung, or a process stopped with SIGSTOP: the kernel still completes the handshake) made
each of the four attempts wait out the client's timeout: a drain started ~22 s late with the
default 5 s, and then stopped the replica though nothing said its ``draining`` got through (it holds
connections: gateways' requests too). Now a timeout ends the post after its one attempt, and such a
drain stops nothing (said as an error; a later round may choose the replica again) while the
replica's load record still changes (a slow sidecar: gateways still route to it); one whose record
stopped changing or is gone (hung: gateways route nothing to it) is stopped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from prefixfleet.fleet.autoscale import (
    LocalAutoscaler,
    PostStep,
    StatePosted,
    drain_goes_on,
    heartbeat_stopped,
    may_have_landed,
    state_post_step,
)
from prefixfleet.fleet.local import FleetSpec, Replica
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, encode_record
from tests.k8s.cluster import running_redis

POLICY = ScalePolicy(min_replicas=1, max_replicas=2)
CLIENT_TIMEOUT_S = 0.3  # the loop's client waits HTTP_TIMEOUT_S (5 s); the rule is the same
LOAD = LoadReport(
    seq=1, ts=0.0, state="ready", engine_ok=True, in_flight=2, queued=0, pending_prefill_tokens=0,
    prefill_tokens_per_s=4000.0, cached_tokens=0, capacity_tokens=60000, summary_version=0,
)  # fmt: skip


@dataclass
class SilentServer:
    """A real listening socket that accepts every connection, reads what comes, never answers."""

    connections: int = 0
    received: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                self.received.append(chunk)
        writer.close()


@contextlib.asynccontextmanager
async def silent_sidecar() -> AsyncIterator[tuple[str, SilentServer]]:
    silent = SilentServer()
    server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", silent
    finally:
        server.close()
        for writer in silent.writers:  # (Server.close_clients is Python 3.13's)
            writer.close()
        await server.wait_closed()


@dataclass
class StubFleet:
    """What ``_drain`` asks of the fleet: its replicas, its name and a stop (recorded, never a
    process)."""

    replicas: list[Replica]
    stopped: list[str] = field(default_factory=list)
    spec: FleetSpec = field(default_factory=FleetSpec)

    async def stop_replica(self, replica: Replica) -> None:
        self.stopped.append(replica.worker_id)


def autoscaler(fleet: Any) -> LocalAutoscaler:
    scaler = LocalAutoscaler(fleet, POLICY)

    async def token(_redis: aioredis.Redis) -> str:
        return "the-fleets-token"

    scaler.control_token = token  # type: ignore[method-assign]  # no Redis needed
    return scaler


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with running_redis(tmp_path) as url:
        yield url


async def drained(redis: aioredis.Redis) -> tuple[LocalAutoscaler, StubFleet, Replica, SilentServer]:
    """replica-0 drained by the loop, its sidecar a silent socket."""
    async with silent_sidecar() as (url, silent), httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
        replica = Replica(index=0, engine=None, engine_url="http://unused", sidecar_url=url)  # type: ignore[arg-type]
        fleet = StubFleet([replica])
        scaler = autoscaler(fleet)
        scaler.draining.add(replica.worker_id)
        scaler.reserved.add(replica.index)
        await scaler._drain(replica, http, redis)
    return scaler, fleet, replica, silent


async def test_a_draining_post_to_a_silent_sidecar_still_heartbeating_is_sent_once_and_stops_nothing(
    redis_url: str,
) -> None:
    async with aioredis.from_url(redis_url) as redis:
        key = FleetKeys(StubFleet([]).spec.fleet_name).load("replica-0")

        async def heartbeat() -> None:  # a slow sidecar's publish loop: its record changes
            for seq in range(1, 10_000):
                await redis.set(key, encode_record(dataclasses.replace(LOAD, seq=seq)), px=10_000)
                await asyncio.sleep(0.05)

        beating = asyncio.create_task(heartbeat())
        try:
            scaler, fleet, replica, silent = await drained(redis)
        finally:
            beating.cancel()
    assert silent.connections == 1, f"{silent.connections} posts to a sidecar that never answers"
    assert b"POST /prefixfleet/state" in b"".join(silent.received)
    assert fleet.replicas == [replica] and fleet.stopped == []  # not stopped: it may be serving
    assert not scaler.draining and not scaler.reserved
    # its draining may have landed: a later round sets it ready if its record says so (`stranded`)
    assert scaler.left == {replica.worker_id}
    errors = [e.detail for e in scaler.events if e.action == "error"]
    assert len(errors) == 1 and errors[0].startswith("replica-0: state draining not set after 1 attempt(s)")
    assert "ReadTimeout" in errors[0], errors
    assert not [e for e in scaler.events if e.action in ("drain", "removed")], scaler.events


@pytest.mark.parametrize("record", ["unchanged", "gone"])
async def test_a_silent_sidecar_that_no_longer_heartbeats_is_stopped_at_once(
    redis_url: str, record: str
) -> None:
    async with aioredis.from_url(redis_url) as redis:
        if record == "unchanged":  # a hung (SIGSTOPped) sidecar's last record, not yet expired
            await redis.set(FleetKeys("local").load("replica-0"), encode_record(LOAD), px=10_000)
        scaler, fleet, _, silent = await drained(redis)
    assert silent.connections == 1  # the draining post; no in-flight wait on a sidecar that is hung
    assert fleet.stopped == ["replica-0"] and fleet.replicas == []
    assert not scaler.draining and not scaler.reserved and not scaler.left
    said = [(e.action, e.detail) for e in scaler.events]
    assert said[1:] == [
        ("state", "replica-0: its sidecar keeps silent and publishes no load: stopping it"),
        ("drain", "replica-0"),
        ("removed", "replica-0"),
    ], said
    assert said[0][0] == "error" and "ReadTimeout" in said[0][1]


def test_heartbeat_stopped() -> None:
    later = dataclasses.replace(LOAD, seq=2)
    assert heartbeat_stopped(LOAD, None) and heartbeat_stopped(None, None) and heartbeat_stopped(LOAD, LOAD)
    assert not heartbeat_stopped(LOAD, later) and not heartbeat_stopped(None, LOAD)


async def test_a_ready_post_to_a_silent_sidecar_is_sent_once() -> None:
    async with silent_sidecar() as (url, silent), httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
        scaler = autoscaler(None)
        posted = await scaler._post_state(http, None, "replica-0", url, "ready", None)  # type: ignore[arg-type]
        assert silent.connections == 1
    assert not posted.ok and posted.silent and posted.status is None and may_have_landed(posted)


@pytest.mark.parametrize(
    ("posted", "goes_on"),
    [
        (StatePosted(True, "t", 200, ""), True),
        (StatePosted(False, "t", None, "no answer (ConnectError)"), True),  # nothing listens there
        (StatePosted(False, "t", None, "no answer (ReadTimeout)", silent=True), False),
        (StatePosted(False, "t", 401, ""), False),
    ],
)
def test_a_drain_stops_no_replica_that_kept_silent(posted: StatePosted, goes_on: bool) -> None:
    assert drain_goes_on(posted) is goes_on


def test_a_timeout_gives_up_at_once_a_refusal_is_retried() -> None:
    assert state_post_step(None, 0, silent=True) is PostStep.GIVE_UP
    assert state_post_step(None, 0) is PostStep.RETRY
    assert state_post_step(200, 0, silent=True) is PostStep.DONE
