"""A sidecar that takes the connection and never answers costs one state post, not four.

``prefixfleet up --autoscale`` retries a state post that got no answer (0.25/0.5/1 s pauses), for a
sidecar restarting its listener or a Redis blip: those fail at once. A sidecar that accepts and then
says nothing (hung, or a process stopped with SIGSTOP: the kernel still completes the handshake) made
each of the four attempts wait out the client's timeout: a drain started ~22 s late with the
default 5 s, and then stopped the replica though nothing said its ``draining`` got through (it holds
connections: gateways' requests too). Now a timeout ends the post after its one attempt, and such a
drain stops nothing (said as an error; a later round may choose the replica again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from prefixfleet.fleet.autoscale import (
    LocalAutoscaler,
    PostStep,
    StatePosted,
    drain_goes_on,
    may_have_landed,
    state_post_step,
)
from prefixfleet.fleet.local import Replica
from prefixfleet.operator.autoscale import ScalePolicy

POLICY = ScalePolicy(min_replicas=1, max_replicas=2)
CLIENT_TIMEOUT_S = 0.3  # the loop's client waits HTTP_TIMEOUT_S (5 s); the rule is the same


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
    """What ``_drain`` asks of the fleet: its replicas and a stop (recorded, never a process)."""

    replicas: list[Replica]
    stopped: list[str] = field(default_factory=list)

    async def stop_replica(self, replica: Replica) -> None:
        self.stopped.append(replica.worker_id)


def autoscaler(fleet: Any) -> LocalAutoscaler:
    scaler = LocalAutoscaler(fleet, POLICY)

    async def token(_redis: aioredis.Redis) -> str:
        return "the-fleets-token"

    scaler.control_token = token  # type: ignore[method-assign]  # no Redis needed
    return scaler


async def test_a_draining_post_to_a_silent_sidecar_is_sent_once_and_stops_nothing() -> None:
    async with silent_sidecar() as (url, silent), httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
        replica = Replica(index=0, engine=None, engine_url="http://unused", sidecar_url=url)  # type: ignore[arg-type]
        fleet = StubFleet([replica])
        scaler = autoscaler(fleet)
        scaler.draining.add(replica.worker_id)
        scaler.reserved.add(replica.index)
        await scaler._drain(replica, http, None)  # type: ignore[arg-type]  # (the token is stubbed)
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
