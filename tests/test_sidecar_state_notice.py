"""A sidecar's state notice names the state its load record holds.

Gateways act on ``state <worker> <state>`` notices on the events channel and read the worker's load
record for the rest: a notice must never run ahead of the record it announces. Redis is paused (a
real Valkey, ``CLIENT PAUSE``) while the sidecar writes a ``warming`` record, and the state turns
``ready`` before that write returns: the notices must say ``warming`` then ``ready``, in that
order (before the fix, the first notice read the live state after the write and said ``ready``
while the record said ``warming``).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import redis
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_load

FLEET = "notice"
pytestmark = pytest.mark.timeout(60)


def record_state(client: redis.Redis) -> str | None:
    raw = client.get(FleetKeys(FLEET).load("w0"))
    return decode_load(raw).state if raw is not None else None


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
    client = redis.Redis.from_url(redis_server.url)
    events = client.pubsub()
    events.subscribe(FleetKeys(FLEET).events)
    deadline = time.monotonic() + 10
    while record_state(client) != "ready" or events.get_message(timeout=0.1) is None:
        assert time.monotonic() < deadline, "the sidecar never published a ready record"
    await asyncio.sleep(0.5)  # start-up rounds done
    while events.get_message(timeout=0.05) is not None:
        pass

    async with aiohttp.ClientSession() as http:
        # Under the sidecar's 1 s Redis timeout: its write waits, it does not fail.
        client.execute_command("CLIENT", "PAUSE", "850", "ALL")
        async with http.post(f"{url}/prefixfleet/state", json={"state": "warming"}) as resp:
            assert resp.status == 200, await resp.text()
        await asyncio.sleep(0.45)  # the round has built its 'warming' record and waits on Redis
        async with http.post(f"{url}/prefixfleet/state", json={"state": "ready"}) as resp:
            assert resp.status == 200, await resp.text()

    notices: list[str] = []
    deadline = time.monotonic() + 5
    while len(notices) < 2 and time.monotonic() < deadline:
        message = await asyncio.to_thread(events.get_message, timeout=0.2)
        if message and message["type"] == "message" and message["data"].startswith(b"state w0 "):
            notices.append(message["data"].decode().split()[-1])
    events.close()
    assert notices == ["warming", "ready"]
    assert record_state(client) == "ready"
