"""Every client of a sidecar's control routes sends the fleet's control token (``X-Prefixfleet-Token``,
the value of ``pf:{fleet}:control`` in the fleet's Redis, as ``redis-cli GET`` shows it), so that a
sidecar can refuse those routes to whoever lacks it (``prefixfleet.router.control``):

* the operator's pre-warm (``POST /prefixfleet/warm``), token read from the fleet's Redis with the
  operator's own client; with that Redis unreachable at warm-up time, the warm-up fails with a
  Warning ``Prewarmed`` Event naming why, and the task ends (no crash, no request without the token);
* the local fleet's flush between policies (``POST /flush_cache`` through each sidecar).

The sidecars here are stand-ins that record what they are sent (an httpx mock transport for the
operator, an aiohttp server on an ephemeral port for the local fleet); Redis is a real Valkey.
The local autoscaler's warm-ups and drains are in tests/test_local_autoscaler_drain_cleanup.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import kopf
import pytest
import redis
from aiohttp import web
from aiohttp.test_utils import TestServer
from kopf._core.engines import posting

from prefixfleet.fleet.local import LocalFleet, Replica
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    autoscale_round,
    prewarm_replica,
)
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.hot_subtrees import HotState, subtree_id
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import FleetRef
from prefixfleet.router.control import CONTROL_HEADER
from prefixfleet.router.keys import FleetKeys
from tests.fleet_fixtures import RedisServer
from tests.test_autoscale_e2e import FLEET
from tests.test_autoscale_prewarm_events import HELPER, HOLDER, HOT, PORTS, fleet
from tests.test_autoscale_round_races import METRICS, kube

__all__ = ["fleet", "kube"]  # the fixtures: the emulated API server, a fleet with a hot prefix


def stored_token(redis_url: str, fleet_name: str) -> str | None:
    """What ``redis-cli GET pf:{fleet}:control`` answers."""
    with redis.Redis.from_url(redis_url) as client:
        value = client.get(FleetKeys(fleet_name).control)
    return value.decode() if value is not None else None


class RecordingSidecars:
    """Every pod's sidecar: up, and answering a warm request; each request's headers are kept."""

    def __init__(self) -> None:
        self.warm_tokens: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/prefixfleet/status":
            return httpx.Response(200, json={"engine_ok": True})
        if path == "/prefixfleet/warm":
            self.warm_tokens.append(request.headers.get(CONTROL_HEADER))
            results = {subtree_id(HOT): {"status": "ok", "tokens": 64}}
            return httpx.Response(200, json={"warmed_tokens": 64, "results": results})
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        return httpx.Response(404)


def operator_parts(kube: Kube, sidecars: RecordingSidecars) -> tuple[Any, ...]:
    posted: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    posting.settings_var.set(kopf.OperatorSettings())
    posting.event_queue_var.set(posted)
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    auto = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient(transport=httpx.MockTransport(sidecars)))
    body = kube.get("PrefixCacheFleet", "default", FLEET)
    assert body is not None
    ref = FleetRef(name=FLEET, namespace="default", uid=body["metadata"]["uid"])
    return posted, auto, OperatorContext(kube=kube), body, ref


def drained(queue: asyncio.Queue[posting.K8sEvent]) -> list[posting.K8sEvent]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def test_the_operators_warm_request_carries_the_token_stored_in_the_fleets_redis(
    fleet: tuple[Kube, str],
) -> None:
    kube, redis_url = fleet
    sidecars = RecordingSidecars()
    posted, auto, ctx, body, ref = operator_parts(kube, sidecars)
    state = FleetAutoscale(hot=HotState(observed_s=time.time() - 1.0, hits={(HOLDER, HOT): 0}))
    try:
        plan = await autoscale_round(
            ctx, auto, state, body, ref, validate_spec(body["spec"]), logging.getLogger("t")
        )
        assert plan is not None and [w.target for w in plan.prewarm] == [HELPER], plan
        await asyncio.wait_for(asyncio.gather(*state.warming), 20)
    finally:
        await auto.http.aclose()
        for client in ctx.redis_clients.values():
            await client.aclose()
    token = stored_token(redis_url, ref.redis_fleet)
    assert token, "no control token in the fleet's Redis"
    assert sidecars.warm_tokens == [token]
    prewarmed = [e for e in drained(posted) if e.reason == "Prewarmed"]
    assert [e.type for e in prewarmed] == ["Normal"], prewarmed


async def test_a_warm_up_whose_token_cannot_be_read_fails_with_a_warning_naming_why(
    fleet: tuple[Kube, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube, _ = fleet
    sidecars = RecordingSidecars()
    posted, auto, ctx, body, ref = operator_parts(kube, sidecars)
    # the fleet's Redis is gone at warm-up time (the round before had read it)
    state = FleetAutoscale(redis_url=f"unix://{tmp_path}/no-redis.sock")
    sids = [subtree_id(HOT)]
    try:
        with caplog.at_level(logging.WARNING):
            await asyncio.wait_for(
                prewarm_replica(ctx, auto, state, body, ref, PORTS[HELPER], HELPER, sids, (), set(),
                                logging.getLogger("t")),
                20,
            )  # fmt: skip
    finally:
        await auto.http.aclose()
        for client in ctx.redis_clients.values():
            await client.aclose()
    assert sidecars.warm_tokens == []  # no warm request went out without the token
    assert not state.warming_pods
    (event,) = [e for e in drained(posted) if e.reason == "Prewarmed"]
    assert event.type == "Warning"
    assert f"pod {HELPER}: 0 hot prefix(es) warmed, 1 failed" in event.message
    assert "cannot read the fleet's control token from Redis" in event.message, event.message
    assert any("control token" in r.getMessage() for r in caplog.records), caplog.records


class FlushRecorder:
    """A stand-in sidecar: answers ``POST /flush_cache`` 200 and keeps the token each one carried
    (and answers the reset's ``POST /prefixfleet/reset_rates`` 200)."""

    def __init__(self) -> None:
        self.tokens: list[str | None] = []
        app = web.Application()
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_post("/prefixfleet/reset_rates", self.reset_rates)
        self.server = TestServer(app, host="127.0.0.1")

    async def flush(self, request: web.Request) -> web.Response:
        self.tokens.append(request.headers.get(CONTROL_HEADER))
        return web.json_response({})

    async def reset_rates(self, _request: web.Request) -> web.Response:
        return web.json_response({})


async def test_the_local_fleets_flush_carries_the_token_stored_in_the_fleets_redis(
    redis_server: RedisServer,
) -> None:
    sidecar = FlushRecorder()
    await sidecar.server.start_server()
    try:
        spec = SimpleNamespace(fleet_name="flushed")
        fleet = LocalFleet(SimpleNamespace(check_alive=lambda: None), spec)  # type: ignore[arg-type]
        fleet.redis = SimpleNamespace(url=redis_server.url)  # type: ignore[assignment]
        child = SimpleNamespace(name="sidecar-0", running=True)
        url = str(sidecar.server.make_url("")).rstrip("/")
        fleet.replicas = [Replica(0, child, "http://127.0.0.1:9", child, url)]  # type: ignore[arg-type]
        await fleet.reset()
        first = stored_token(redis_server.url, "flushed")
        # a rotation (redis-cli DEL pf:flushed:control) holds for the next flush
        with redis.Redis.from_url(redis_server.url) as client:
            client.delete(FleetKeys("flushed").control)
        await fleet.reset()
        second = stored_token(redis_server.url, "flushed")
    finally:
        await sidecar.server.close()
    assert first and second and first != second
    assert sidecar.tokens == [first, second]
