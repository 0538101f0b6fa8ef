"""``status.hitRate``, the Hit rate column of ``kubectl get pcf``, is written by the autoscaler.

The CRD has printed the column since the start and docs/operator.md shows it (``0.83``), but nothing
wrote the field: the column was blank on every fleet. The autoscaler's rounds now write the share of
the replicas' prompt tokens their engines found cached over the rate window (from the same engine
rates it plans with: Prometheus or each sidecar's /metrics), to two places; remove it while the
fleet prefills nothing; and autoscaling switched off removes it with the decision (no round keeps
it current). In-process: the round's own code against the emulated API server (with the CRD's
status schema) and a real Valkey, the sidecars' /metrics answered by an httpx mock transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kopf
import pytest
import redis
from kopf._core.engines import posting

from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    autoscale_forget,
    autoscale_round,
    fleet_hit_rate,
)
from prefixfleet.operator.autoscale_observe import EngineRates
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import FleetRef
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import encode_record
from tests.k8s.cluster import running_redis
from tests.test_autoscale_e2e import FLEET, replica_pod
from tests.test_autoscale_round_races import FLEET_PATH, IDLE, fleet_manifest, kube  # noqa: F401

PODS = (f"{FLEET}-replica-0", f"{FLEET}-replica-1")


def exposition(prompt: int, cached: int) -> str:
    return (
        f"sglang:prompt_tokens_total {prompt}\nsglang:cached_tokens_total {cached}\nsglang:num_queue_reqs 0\n"
    )


class Fleet:
    """A two-replica autoscaled fleet that holds at two (minReplicas 2), whose engines have served
    ``counters[pod]`` = (prompt, cached) tokens so far."""

    def __init__(self, kube: Kube, redis_url: str) -> None:  # noqa: F811
        self.kube = kube
        self.counters = {pod: (0, 0) for pod in PODS}
        self.down = False  # every sidecar's /metrics answers 503
        posting.settings_var.set(kopf.OperatorSettings())
        posting.event_queue_var.set(asyncio.Queue())
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        manifest = fleet_manifest(redis_url)
        manifest["spec"]["autoscaling"]["minReplicas"] = 2
        kube.request("POST", FLEET_PATH, body=manifest)
        with redis.Redis.from_url(redis_url) as client:
            for i, name in enumerate(PODS):
                kube.create(replica_pod(name, f"http://127.0.0.1:{40000 + i}"))
                client.set(FleetKeys(f"default.{FLEET}").load(name), encode_record(IDLE))
        ports = {40000 + i: pod for i, pod in enumerate(PODS)}

        def sidecar(request: httpx.Request) -> httpx.Response:
            if self.down:
                return httpx.Response(503)
            return httpx.Response(200, text=exposition(*self.counters[ports[request.url.port or 0]]))

        self.auto = AutoscaleContext(
            OperatorMetrics(), httpx.AsyncClient(transport=httpx.MockTransport(sidecar))
        )
        self.ctx = OperatorContext(kube=kube)
        self.state = FleetAutoscale()  # kept across rounds: the scrape's rates are counter growth

    def body(self) -> dict[str, Any]:
        body = self.kube.get("PrefixCacheFleet", "default", FLEET)
        assert body is not None
        return body

    async def round(self) -> Any:
        body = self.body()
        ref = FleetRef(name=FLEET, namespace="default", uid=body["metadata"]["uid"])
        spec = validate_spec(body["spec"])
        await autoscale_round(self.ctx, self.auto, self.state, body, ref, spec, logging.getLogger("test"))
        return (self.body().get("status") or {}).get("hitRate")

    async def close(self) -> None:
        await self.auto.http.aclose()
        for client in self.ctx.redis_clients.values():
            await client.aclose()


@pytest.fixture
async def fleet(kube: Kube, tmp_path: Path) -> AsyncIterator[Fleet]:  # noqa: F811
    with running_redis(tmp_path) as redis_url:
        fleet = Fleet(kube, redis_url)
        try:
            yield fleet
        finally:
            await fleet.close()


async def test_the_rounds_write_the_fleets_token_weighted_hit_rate(fleet: Fleet) -> None:
    assert await fleet.round() is None  # the first scrape: no rates yet, nothing said
    fleet.counters = {PODS[0]: (3000, 2700), PODS[1]: (1000, 500)}
    assert await fleet.round() == 0.8  # (2700 + 500) / (3000 + 1000)
    assert await fleet.round() is None  # no prompt tokens since: no hit rate to show
    fleet.counters = {PODS[0]: (4000, 3700), PODS[1]: (1000, 500)}
    assert await fleet.round() == 1.0


async def test_no_engine_answering_removes_the_hit_rate(fleet: Fleet) -> None:
    # kept only while the replicas answer but have no rate yet (the first scrape after a start): when
    # none answers (engineMetrics source none) the last rate would read as today's for as long
    await fleet.round()
    fleet.counters = {PODS[0]: (1000, 600), PODS[1]: (1000, 600)}
    assert await fleet.round() == 0.6
    fleet.down = True
    assert await fleet.round() is None
    assert (fleet.body().get("status") or {})["engineMetrics"]["source"] == "none"
    fleet.down = False
    assert await fleet.round() is None  # answering again: the first scrape has no rate yet
    fleet.counters = {PODS[0]: (2000, 1500), PODS[1]: (1000, 600)}
    assert await fleet.round() == 0.9  # (1500 - 600) / (2000 - 1000)


async def test_autoscaling_switched_off_removes_the_hit_rate(fleet: Fleet) -> None:
    await fleet.round()
    fleet.counters = {PODS[0]: (1000, 250), PODS[1]: (1000, 250)}
    assert await fleet.round() == 0.25
    fleet.kube.merge_patch(
        "PrefixCacheFleet", "default", FLEET, {"spec": {"autoscaling": {"enabled": False}}}
    )
    body = fleet.body()
    memo = kopf.Memo()
    memo.ctx, memo.autoscale = fleet.ctx, fleet.auto
    await autoscale_forget(body=kopf.Body(body), memo=memo, type="MODIFIED", logger=logging.getLogger("test"))
    assert "hitRate" not in (fleet.body().get("status") or {})


def test_the_hit_rate_is_clamped_and_rounded() -> None:
    # Prometheus extrapolates each rate on its own: cached may read above prompt (the schema's
    # maximum is 1, and a value above it loses the round's whole status patch)
    assert fleet_hit_rate({"a": EngineRates(100.0, 103.0)}) == 1.0
    assert fleet_hit_rate({"a": EngineRates(3.0, 2.0)}) == 0.67
    assert fleet_hit_rate({"a": EngineRates(0.0, 0.0), "b": EngineRates(0.0, 0.0)}) is None
