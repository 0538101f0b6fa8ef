"""An autoscaler round racing a user's edit of the fleet (in-process: the round's own code against the
emulated API server and a real Valkey; the sidecars' /metrics answered by an httpx mock transport, in
which the "user" edits the fleet while the round is observing).

Specification: a round plans from the fleet it was handed; if the fleet's spec changed (a new
generation) or the fleet went away while it observed, the plan is not executed (no /scale, no
victim, no Event): the next round plans again from what the user wrote.
* minReplicas raised during a round planning a scale-down: spec.replicas stays at the new minimum;
* autoscaling switched off with a manual spec.replicas: the user's replicas stay;
* the fleet deleted: the round ends without an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import kopf
import kubernetes
import pytest
import redis
import yaml
from kopf._core.engines import posting

from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    autoscale_round,
)
from prefixfleet.operator.handlers import ANNOTATION_VICTIMS, OperatorContext
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import FleetRef
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, encode_record
from tests.k8s.apiserver import ApiServerThread
from tests.k8s.cluster import REPO, running_redis
from tests.test_autoscale_e2e import FLEET, replica_pod

CRD = REPO / "crds" / "prefixcachefleets.prefixfleet.io.yaml"
FLEET_PATH = "/apis/prefixfleet.io/v1alpha1/namespaces/default/prefixcachefleets"

Edit = Callable[[Kube], Awaitable[None]]


def fleet_manifest(redis_url: str) -> dict[str, Any]:
    fleet = yaml.safe_load((REPO / "examples" / "emulator-fleet.yaml").read_text())
    fleet["metadata"] = {"name": FLEET, "namespace": "default"}
    fleet["spec"]["replicas"] = 2
    fleet["spec"]["redis"] = {"url": redis_url}
    fleet["spec"]["prewarm"] = {"enabled": False}
    # two idle replicas and no quiet period to wait for: the first round plans a scale-down to 1
    fleet["spec"]["autoscaling"] = {
        "enabled": True, "minReplicas": 1, "maxReplicas": 3, "intervalSeconds": 1,
        "scaleDownStabilizationSeconds": 0,
    }  # fmt: skip
    return fleet


IDLE = LoadReport(
    seq=1, ts=0.0, state="ready", engine_ok=True, in_flight=0, queued=0, pending_prefill_tokens=0,
    prefill_tokens_per_s=4000.0, cached_tokens=0, capacity_tokens=60000, summary_version=0,
)  # fmt: skip
METRICS = "sglang:prompt_tokens_total 0\nsglang:cached_tokens_total 0\nsglang:num_queue_reqs 0\n"


class Round:
    """One fleet in the emulated API server, its pods' load records in Valkey, and a round to run."""

    def __init__(self, kube: Kube, redis_url: str) -> None:
        self.kube = kube
        self.redis_url = redis_url
        self.events: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
        posting.settings_var.set(kopf.OperatorSettings())
        posting.event_queue_var.set(self.events)
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        self.kube.request("POST", FLEET_PATH, body=fleet_manifest(redis_url))
        keys = FleetKeys(f"default.{FLEET}")
        with redis.Redis.from_url(redis_url) as client:
            for i, name in enumerate((f"{FLEET}-replica-0", f"{FLEET}-replica-1")):
                self.kube.create(replica_pod(name, f"http://127.0.0.1:{40000 + i}"))
                client.set(keys.load(name), encode_record(IDLE))

    def fleet(self) -> dict[str, Any] | None:
        return self.kube.get("PrefixCacheFleet", "default", FLEET)

    async def run(self, edit: Edit) -> list[str]:
        """A round whose observation is interrupted by ``edit`` (as a user's kubectl would be);
        returns the reasons of the Events it posted."""
        body = self.fleet()
        assert body is not None
        edited = False

        async def sidecar(request: httpx.Request) -> httpx.Response:
            nonlocal edited
            if not edited:  # the round is observing: the user edits the fleet now
                edited = True
                await edit(self.kube)
            return httpx.Response(200, text=METRICS)

        auto = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient(transport=httpx.MockTransport(sidecar)))
        ctx = OperatorContext(kube=self.kube)
        ref = FleetRef(name=FLEET, namespace="default", uid=body["metadata"]["uid"])
        try:
            await autoscale_round(ctx, auto, FleetAutoscale(), body, ref, validate_spec(body["spec"]),
                                  logging.getLogger("test.autoscale"))  # fmt: skip
        finally:
            await auto.http.aclose()
            for client in ctx.redis_clients.values():
                await client.aclose()
        assert edited, "the round never read the sidecars: the race was not exercised"
        reasons = []
        while not self.events.empty():
            reasons.append(self.events.get_nowait().reason)
        return reasons


@pytest.fixture
def kube() -> Iterator[Kube]:
    """The emulated API server with the CRD (the other tests/test_autoscale_* files import it)."""
    api = ApiServerThread().start()
    try:
        kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url)))
        kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     body=yaml.safe_load(CRD.read_text()))  # fmt: skip
        yield kube
    finally:
        api.stop()


@pytest.fixture
async def raced(kube: Kube, tmp_path: Path) -> AsyncIterator[Round]:
    with running_redis(tmp_path) as redis_url:
        yield Round(kube, redis_url)


def patch_spec(spec: dict[str, Any]) -> Edit:
    async def edit(kube: Kube) -> None:
        await asyncio.to_thread(kube.merge_patch, "PrefixCacheFleet", "default", FLEET, {"spec": spec})

    return edit


async def test_the_baseline_round_scales_down(raced: Round) -> None:
    # an edit that changes nothing the round cares about (a label): the scale-down goes ahead
    async def label(kube: Kube) -> None:
        await asyncio.to_thread(kube.annotate, "PrefixCacheFleet", "default", FLEET, {"note": "x"})

    reasons = await raced.run(label)
    fleet = raced.fleet()
    assert fleet is not None
    assert fleet["spec"]["replicas"] == 1 and reasons == ["ScalingDown"], (fleet["spec"], reasons)
    assert fleet["metadata"]["annotations"].get(ANNOTATION_VICTIMS)


async def test_min_replicas_raised_during_a_round_is_not_undercut(raced: Round) -> None:
    reasons = await raced.run(patch_spec({"autoscaling": {"minReplicas": 2}}))
    fleet = raced.fleet()
    assert fleet is not None
    assert fleet["spec"]["replicas"] == 2, fleet["spec"]  # never below the minimum the user set
    assert ANNOTATION_VICTIMS not in (fleet["metadata"].get("annotations") or {})
    assert reasons == []


async def test_autoscaling_switched_off_during_a_round_keeps_the_users_replicas(raced: Round) -> None:
    await raced.run(patch_spec({"autoscaling": {"enabled": False}, "replicas": 3}))
    fleet = raced.fleet()
    assert fleet is not None
    assert fleet["spec"]["replicas"] == 3, fleet["spec"]


async def test_a_fleet_deleted_during_a_round_ends_it_quietly(raced: Round) -> None:
    async def delete(kube: Kube) -> None:
        await asyncio.to_thread(kube.delete, "PrefixCacheFleet", "default", FLEET)

    assert await raced.run(delete) == []
    assert raced.fleet() is None
