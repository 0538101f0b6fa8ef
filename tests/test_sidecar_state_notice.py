"""A sidecar's state notice names the state its load record holds.

Gateways act on ``state <worker> <state>`` notices on the events channel and read the worker's load
record for the rest: a notice must never run ahead of the record it announces. Redis's writes are
paused (a real Valkey, ``CLIENT PAUSE ... WRITE``) while the sidecar writes a ``warming`` record; once
Valkey shows that write blocked, the state turns ``ready``, then the pause is lifted: the notices must
say ``warming`` then ``ready``, in that order (before the fix, the first notice read the live state
after the write and said ``ready`` while the record said ``warming``).

The steps wait on states (the write seen blocked in ``CLIENT LIST``, an explicit ``CLIENT UNPAUSE``),
not on fixed sleeps inside a fixed pause: the earlier version slept 0.45 s inside an 850 ms pause and
relied on the sidecar's 1 s Redis timeout not firing in the remaining 150 ms, both of which a loaded
machine breaks.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp
import pytest
import redis
from control_fixtures import fleet_token, token_header
from fleet_fixtures import (
    RedisServer,
    Spawned,
    Spawner,
    free_port,
    prefixfleet_argv,
    wait_for_http,
    wait_until,
)

from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_load

FLEET = "notice"
# The sidecar's Redis timeout (1 s) runs from its blocked write to our UNPAUSE; this pause is only a
# safety net in case the test dies in between (Valkey lifts it by itself).
PAUSE_MS = 20_000
# A try that proves nothing (see one_try) is repeated, up to this many in all.
ATTEMPTS = 3
SECOND_NOTICE_S = 10.0  # after the first notice, how long a second one may take
WRITES = {"set", "publish", "hset", "pexpire"}  # what a publish round sends (a pipeline)
pytestmark = pytest.mark.timeout(180)


def record_state(client: redis.Redis) -> str | None:
    raw = client.get(FleetKeys(FLEET).load("w0"))
    return decode_load(raw).state if raw is not None else None


def record_engine_ok(client: redis.Redis) -> bool:
    raw = client.get(FleetKeys(FLEET).load("w0"))
    return raw is not None and decode_load(raw).engine_ok


def blocked_writes(client: redis.Redis) -> list[dict]:
    """Connections whose write waits on the pause (flag ``b``); ours never write while paused."""
    return [c for c in client.client_list() if "b" in c["flags"] and c["cmd"] in WRITES]


def sidecar_status(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/prefixfleet/status", timeout=30) as resp:
        return json.load(resp)


def settled(client: redis.Redis, events: redis.client.PubSub, url: str) -> None:
    """Until the sidecar published a ready record with its engine up (the start-up rounds are done:
    the engine turning healthy is a round of its own, which once was the write the test saw blocked)
    and says Redis is fine; then drop every notice so far (start-up, an inconclusive try)."""

    def ready() -> bool:
        status = sidecar_status(url)
        return (
            record_state(client) == "ready"
            and record_engine_ok(client)
            and status["redis_ok"]
            and status["state"] == "ready"
        )

    wait_until(ready, 30, "the sidecar to publish a ready record with Redis up", interval=0.1)
    while events.get_message(timeout=0.2) is not None:
        pass


async def one_try(
    http: aiohttp.ClientSession,
    url: str,
    client: redis.Redis,
    events: redis.client.PubSub,
    sidecar: Spawned,
    control: dict[str, str],
) -> list[str] | None:
    """warming (write blocked) -> ready -> unpause; the notices seen, or None when the try proves
    nothing: the sidecar's paused write timed out after all, or the blocked write was another round's
    (a load push), so both state changes went out in one later round (one notice)."""
    timed_out_before = sidecar.log().count("redis unavailable")
    client.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "WRITE")
    try:
        async with http.post(f"{url}/prefixfleet/state", json={"state": "warming"}, headers=control) as resp:
            assert resp.status == 200, await resp.text()
        # the round has built its 'warming' record and its write waits on the pause
        await asyncio.to_thread(wait_until, lambda: blocked_writes(client), 30, "the round's write to block")
        async with http.post(f"{url}/prefixfleet/state", json={"state": "ready"}, headers=control) as resp:
            assert resp.status == 200, await resp.text()
    finally:
        client.execute_command("CLIENT", "UNPAUSE")

    notices: list[str] = []
    deadline = time.monotonic() + 30
    while len(notices) < 2 and time.monotonic() < deadline:
        message = await asyncio.to_thread(events.get_message, timeout=0.2)
        if message and message["type"] == "message" and message["data"].startswith(b"state w0 "):
            notices.append(message["data"].decode().split()[-1])
            # a second round follows the first at once (its state change is already pending)
            deadline = min(deadline, time.monotonic() + SECOND_NOTICE_S)
    if sidecar.log().count("redis unavailable") > timed_out_before or len(notices) == 1:
        return None
    return notices


async def test_a_state_notice_never_runs_ahead_of_the_load_record(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    engine_port, sidecar_port = free_port(), free_port()
    engine = spawn(prefixfleet_argv("emulator", "--port", str(engine_port)), name="engine")
    # a long publish interval: rounds run only when something changes, so none is in flight below
    sidecar = spawn(
        prefixfleet_argv("router", "sidecar", "--engine", f"http://127.0.0.1:{engine_port}",
                         "--redis", redis_server.url, "--port", str(sidecar_port), "--worker-id", "w0",
                         "--fleet", FLEET, "--publish-interval", "30"), name="sidecar")  # fmt: skip
    wait_for_http(f"http://127.0.0.1:{engine_port}/health", proc=engine.proc)
    url = f"http://127.0.0.1:{sidecar_port}"
    wait_for_http(f"{url}/prefixfleet/status", proc=sidecar.proc)
    client = redis.Redis.from_url(redis_server.url, socket_timeout=30)
    events = client.pubsub(ignore_subscribe_messages=True)
    events.subscribe(FleetKeys(FLEET).events)

    control = token_header(await fleet_token(redis_server.url, FLEET))  # as the operator sends it
    tries: list[list[str] | None] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        while len(tries) < ATTEMPTS and (not tries or tries[-1] is None):
            await asyncio.to_thread(settled, client, events, url)
            tries.append(await one_try(http, url, client, events, sidecar, control))
    events.close()
    assert tries[-1] is not None, f"no try was conclusive: {tries}\n{sidecar.log()[-2000:]}"
    assert tries[-1] == ["warming", "ready"]
    assert record_state(client) == "ready"
