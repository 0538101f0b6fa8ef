"""The gateway's and the sidecar's background loops outlive their errors.

Specification:
* the gateway's load-push subscriber, hit by an unexpected exception while applying a push, logs it
  with its traceback, subscribes again after a short backoff and adopts the pushes that follow
  (it used to catch only Redis errors: anything else ended the task silently and the gateway then
  saw load only at its polling refresh);
* the gateway's refresh skips (and warns about) a member whose name is no worker id, e.g. not UTF-8,
  and keeps the rest of the fleet in view (such a name failed every refresh: the view froze);
* the sidecar's engine watch, hit by an unexpected exception while reading the engine's info (an
  engine info number beyond a float did it: ``float()`` raised OverflowError; such figures are now
  refused, see tests/test_bad_input_more.py), logs it and keeps probing: it still notices the engine
  turning healthy and, later, unhealthy (the task used to die, freezing ``engine_ok`` for good);
* the sidecar's publish loop, asked to change state during a Redis outage, retries with backoff
  instead of at once (it re-set the event it then waited on: thousands of connection attempts a
  second for the whole outage), and publishes the new state once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer
from control_fixtures import fleet_token, token_header
from fleet_fixtures import LOOPBACK, RedisServer, eventually

from prefixfleet.router.gateway import Gateway, GatewayConfig
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import (
    LoadReport,
    MemberRecord,
    decode_member,
    encode_load_push,
    encode_record,
)
from prefixfleet.router.sidecar import Sidecar, SidecarConfig
from prefixfleet.router.view import FleetView


class FirstPushFails(FleetView):
    """A real fleet view whose first pushed load raises, as a bug in applying one would."""

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__(
            block_tokens=config.block_tokens,
            dead_after_s=config.dead_after_s,
            overlay_ttl_s=config.overlay_ttl_s,
            default_prefill_tokens_per_s=config.prefill_tokens_per_s,
        )
        self.failures_left = 1

    def apply_load(self, worker_id: str, load: LoadReport, now: float) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise RuntimeError("injected: applying a pushed load failed")
        super().apply_load(worker_id, load, now)


class FirstEngineInfoFails(Sidecar):
    """A real sidecar whose first reading of the engine's info raises, as a bug in parsing it would."""

    def __init__(self, config: SidecarConfig) -> None:
        super().__init__(config)
        self.failures_left = 1

    async def _fetch_engine_info(self) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise RuntimeError("injected: reading the engine's info failed")
        await super()._fetch_engine_info()


KEYS = FleetKeys("loops")
MEMBER = encode_record(MemberRecord(url="http://127.0.0.1:9"))  # never reached: nothing is routed
IDLE_LOAD = LoadReport(1, 1764489612.0, "ready", True, 0, 0, 0, 12000.0, 0, 65536, 0)


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_server.url)
    yield client
    await client.aclose()


def loops_gateway(redis_url: str, refresh_interval_s: float) -> tuple[Gateway, web.AppRunner]:
    """A gateway of the ``loops`` fleet and its app's runner, not yet set up (the caller sets it up
    and cleans it up)."""
    gateway = Gateway(
        GatewayConfig(port=0, redis_url=redis_url, fleet=KEYS.fleet, refresh_interval_s=refresh_interval_s)
    )
    return gateway, web.AppRunner(gateway.app(), handle_signals=False)


@pytest.mark.timeout(60)
async def test_gateway_load_push_subscriber_survives_an_unexpected_error(
    redis_server: RedisServer, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client, keys = redis_client, KEYS
    await client.hset(keys.members, "w0", MEMBER)
    await client.set(keys.load("w0"), encode_record(IDLE_LOAD))
    gateway, runner = loops_gateway(redis_server.url, refresh_interval_s=3600)
    view = gateway.view = FirstPushFails(gateway.config)

    async def subscribed() -> bool:
        return dict(await client.pubsub_numsub(keys.loads)).get(keys.loads.encode(), 0) >= 1

    try:
        await runner.setup()
        assert gateway.view.workers["w0"].load == IDLE_LOAD  # the start-up refresh; none after it
        await eventually(subscribed, 20, "the gateway to subscribe to the loads channel")
        first = LoadReport(2, 1764489613.0, "ready", True, 5, 3, 900, 12000.0, 0, 65536, 0)
        with caplog.at_level(logging.ERROR, logger="prefixfleet.gateway"):
            await client.publish(keys.loads, encode_load_push("w0", encode_record(first)))
            await eventually(lambda: view.failures_left == 0, 20, "the push to arrive")
            later = LoadReport(3, 1764489614.0, "ready", True, 1, 0, 100, 12000.0, 0, 65536, 0)

            async def adopted() -> bool:  # re-published: the one sent while re-subscribing is lost
                await client.publish(keys.loads, encode_load_push("w0", encode_record(later)))
                return gateway.view.workers["w0"].load == later

            await eventually(adopted, 20, "the gateway to adopt load pushes again after the error")
        logged = [r for r in caplog.records if r.name == "prefixfleet.gateway" and r.exc_info]
        assert logged, "the unexpected error was not logged"
        assert "injected: applying a pushed load failed" in str(logged[0].exc_info[1])
        assert logged[0].getMessage().startswith("load push subscriber failed unexpectedly")
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
async def test_gateway_refresh_skips_a_member_whose_name_is_no_worker_id(
    redis_server: RedisServer, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client, keys = redis_client, KEYS
    await client.hset(keys.members, mapping={b"\xffw": MEMBER, b"bad id!": MEMBER})
    gateway, runner = loops_gateway(redis_server.url, refresh_interval_s=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="prefixfleet.gateway"):
            await runner.setup()
            # a worker joining after the bad names: only a refresh that still works can show it
            await client.hset(keys.members, "w0", MEMBER)
            await client.set(keys.load("w0"), encode_record(IDLE_LOAD))
            await eventually(lambda: "w0" in gateway.view.workers, 20, "the gateway's refresh to show w0")
        assert set(gateway.view.workers) == {"w0"}
        warnings = [r.getMessage() for r in caplog.records if r.name == "prefixfleet.gateway"]
        assert f"ignoring member '\ufffdw' of {keys.members}: not a valid worker id" in warnings, warnings
        assert f"ignoring member 'bad id!' of {keys.members}: not a valid worker id" in warnings, warnings
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestServer]:
    server = TestServer(app, host=LOOPBACK)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@pytest.mark.timeout(60)
async def test_sidecar_engine_watch_survives_an_unexpected_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine_status = {"health": 200}
    info = '{"served_model_name":"m","emulator":{"prefill_tokens_per_s":30000,"time_scale":1}}'

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=engine_status["health"])

    async def server_info(_request: web.Request) -> web.Response:
        return web.Response(text=info, content_type="application/json")

    engine_app = web.Application()
    engine_app.router.add_get("/health", health)
    engine_app.router.add_get("/get_server_info", server_info)
    async with serving(engine_app) as engine, aiohttp.ClientSession() as http:
        engine_url = str(engine.make_url("")).rstrip("/")
        sidecar = FirstEngineInfoFails(
            SidecarConfig(engine_url=engine_url, redis_url=None, port=1, worker_id="w0")
        )
        with caplog.at_level(logging.ERROR, logger="prefixfleet.sidecar"):
            async with serving(sidecar.app()) as front:

                def engine_ok_is(expected: bool):
                    async def check() -> bool:
                        async with http.get(front.make_url("/prefixfleet/status")) as resp:
                            return (await resp.json())["engine_ok"] is expected

                    return check

                await eventually(
                    engine_ok_is(True), 20, "the sidecar to see the engine healthy", interval=0.1
                )
                engine_status["health"] = 503
                await eventually(
                    engine_ok_is(False),
                    20,
                    "the sidecar, still probing, to see the engine unhealthy",
                    interval=0.1,
                )
        logged = [r for r in caplog.records if r.name == "prefixfleet.sidecar" and r.exc_info]
        assert logged and isinstance(logged[0].exc_info[1], RuntimeError), caplog.records
        assert logged[0].getMessage().startswith("engine watch failed unexpectedly")


@pytest.mark.timeout(60)
async def test_sidecar_retries_a_state_change_during_a_redis_outage_with_backoff(
    redis_server: RedisServer,
) -> None:
    keys = FleetKeys("loops")
    config = SidecarConfig(
        engine_url="http://127.0.0.1:9", redis_url=redis_server.url, port=1, worker_id="w0", fleet="loops"
    )
    sidecar = Sidecar(config)
    # The drain below is checked against the token the sidecar read before the outage, within the
    # grace after its last read (router.control.UNCONFIRMED_GRACE_S, tested in
    # test_sidecar_control_token.py); not what this test is about, so a stalled machine must not
    # make the grace run out first
    assert sidecar.control is not None
    sidecar.control.grace_s = 3600.0
    attempts = 0

    async def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        writer.close()

    async with serving(sidecar.app()) as front, aiohttp.ClientSession() as http:
        client = redis_server.client()
        wanted = {"state": "ready"}

        def registered() -> bool:
            raw = client.hget(keys.members, "w0")
            return raw is not None and decode_member(raw).state == wanted["state"]

        try:
            await eventually(registered, 20, "the sidecar to register")
            # the operator's drain carries the fleet's control token, read before the outage; the
            # sidecar read it before it first registered, so it still checks it with Redis down
            # (within the grace)
            token = await fleet_token(redis_server.url, "loops")
            redis_server.stop()
            # In Redis's place, a server that hangs up at once: each publish attempt is one connection.
            outage = await asyncio.start_server(hang_up, LOOPBACK, redis_server.port)
            try:
                await eventually(lambda: attempts > 0, 20, "the sidecar to try to publish")
                async with http.post(
                    front.make_url("/prefixfleet/state"),
                    json={"state": "draining"},
                    headers=token_header(token),
                ) as resp:
                    assert resp.status == 200, await resp.text()
                before = attempts
                await asyncio.sleep(1.5)
                # backoff 0.25 s doubling to 2 s, and redis-py's own few retries per attempt: a dozen
                # or so; retrying at once made thousands
                assert attempts - before < 100, attempts - before
            finally:
                outage.close()
                await outage.wait_closed()
            redis_server.start()  # empty: the sidecar must register again, in its new state
            wanted["state"] = "draining"
            # after the restart: the sidecar's backoff (up to 2 s) and its reconnect, then a round;
            # a bound (was 10 s), not an expectation
            await eventually(registered, 30, "the state change to be published after the outage")

            async def status() -> dict:
                async with http.get(front.make_url("/prefixfleet/status")) as resp:
                    return await resp.json()

            # redis_ok turns back on once the whole publish round went through (the member entry is
            # written first, so it can be seen a moment earlier): wait for it, don't sample it once
            back = await eventually(
                status, 30, "the sidecar to report Redis back", done=lambda s: s["redis_ok"]
            )
            assert (back["state"], back["redis_ok"]) == ("draining", True)
        finally:
            client.close()
