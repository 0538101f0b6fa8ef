"""An idle replica's pre-warm that is still under way when the next round plans it again (in-process:
the autoscaler's rounds against the emulated API server and a real Valkey; the sidecars answered by
an httpx mock transport whose warm request stays in flight until the test lets it finish).

Specification: a round that plans the warm-up of an existing replica already being warmed starts no
second warm-up and posts no second ``Prewarming`` Event: the Event says a warm-up began, once per
warm-up, not once per round while the fleet stays in the same state. Before, every round posted it
again (and started a task that only logged "already warming").
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import kopf
import pytest
import redis
from kopf._core.engines import posting

from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    autoscale_round,
)
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.hot_subtrees import HotState, subtree_id
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import FleetRef
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import encode_record
from prefixfleet.router.summary import HotNode, encode_summary, make_summary
from tests.fleet_fixtures import eventually
from tests.k8s.cluster import running_redis
from tests.test_autoscale_e2e import FLEET, replica_pod
from tests.test_autoscale_round_races import FLEET_PATH, IDLE, METRICS, fleet_manifest, kube

__all__ = ["kube"]  # the fixture: the emulated API server with the CRD

HOLDER, HELPER = f"{FLEET}-replica-0", f"{FLEET}-replica-1"
PORTS = {HOLDER: 41000, HELPER: 41001}
HOT = 0x00000000C0FFEE00  # the hot prefix only the holder has


class Sidecars:
    """Every replica's sidecar; a warm request is answered only once ``finish`` is set."""

    def __init__(self) -> None:
        self.warm_requests: list[int | None] = []
        self.finish = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if path == "/prefixfleet/status":
            return httpx.Response(200, json={"engine_ok": True})
        if path == "/prefixfleet/warm":
            self.warm_requests.append(request.url.port)
            await self.finish.wait()
            results = {subtree_id(HOT): {"status": "ok", "tokens": 64}}
            answer = {"worker_id": HELPER, "state": "ready", "warmed_tokens": 64, "results": results}
            return httpx.Response(200, json=answer)
        return httpx.Response(404)


@pytest.fixture
async def fleet(kube: Kube, tmp_path: Path) -> AsyncIterator[tuple[Kube, str]]:
    with running_redis(tmp_path) as redis_url:
        manifest = fleet_manifest(redis_url)
        manifest["spec"]["prewarm"] = {"enabled": True, "topSubtrees": 2}
        kube.request("POST", FLEET_PATH, body=manifest)
        keys = FleetKeys(f"default.{FLEET}")
        summary = make_summary(
            worker=HOLDER, version=1, generated_at=time.time(), block_tokens=16, identity_seed=1,
            cached_tokens=64, capacity_tokens=60000, blocks=array("Q", [HOT]),
            hot=[HotNode(HOT, 64, 100, time.time())],
        )  # fmt: skip
        with redis.Redis.from_url(redis_url) as client:
            for name, port in PORTS.items():
                kube.create(replica_pod(name, f"http://127.0.0.1:{port}"))
            # the holder waits 10 s for its prefill queue; the helper is idle
            client.set(keys.load(HOLDER), encode_record(replace(IDLE, pending_prefill_tokens=40000)))
            client.set(keys.load(HELPER), encode_record(IDLE))
            client.set(keys.summary(HOLDER), encode_summary(summary))
        yield kube, redis_url


async def test_a_warm_up_under_way_is_not_started_again_nor_announced_every_round(
    fleet: tuple[Kube, str],
) -> None:
    kube, _ = fleet
    events: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    posting.settings_var.set(kopf.OperatorSettings())
    posting.event_queue_var.set(events)
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    sidecars = Sidecars()
    auto = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient(transport=httpx.MockTransport(sidecars)))
    ctx = OperatorContext(kube=kube)
    # the holder's hit counter was 0 a second ago: the prefix is hot from the first round
    state = FleetAutoscale(hot=HotState(observed_s=time.time() - 1.0, hits={(HOLDER, HOT): 0}))
    body = kube.get("PrefixCacheFleet", "default", FLEET)
    assert body is not None
    ref = FleetRef(name=FLEET, namespace="default", uid=body["metadata"]["uid"])
    spec = validate_spec(body["spec"])
    logger = logging.getLogger("test.autoscale")
    try:
        first = await autoscale_round(ctx, auto, state, body, ref, spec, logger)
        assert first is not None and [w.target for w in first.prewarm] == [HELPER], first
        await eventually(lambda: sidecars.warm_requests, 20, "the helper's warm request")
        # the next rounds, while that warm-up is still under way, plan it again
        for _ in range(2):
            again = await autoscale_round(ctx, auto, state, body, ref, spec, logger)
            assert again is not None and [w.target for w in again.prewarm] == [HELPER], again
        sidecars.finish.set()
        await asyncio.wait_for(asyncio.gather(*state.warming), 20)
        reasons = []
        while not events.empty():
            reasons.append(events.get_nowait().reason)
        assert reasons == ["Prewarming", "Prewarmed"], reasons
        assert sidecars.warm_requests == [PORTS[HELPER]]
    finally:
        sidecars.finish.set()
        await auto.http.aclose()
        for client in ctx.redis_clients.values():
            await client.aclose()
