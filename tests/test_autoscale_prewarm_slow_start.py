"""The operator's pre-warm of a new pod that takes long to become Ready (a node to provision, a large
image to pull, a model to load: minutes on a real GPU fleet). In-process: the operator's pre-warm task
against the emulated API server; the sidecars answered by an httpx mock transport.

Specification: the time a new pod needs to become Ready does not eat into its warm-up's budget
(``WARM_TIMEOUT_S``, for the warm requests): the pod stays marked ``warming`` while it starts, and is
warmed (``hold_traffic``) once its sidecar answers, then unmarked. Before, one 180 s deadline counted
from the scale-up covered both: a pod Ready after it was never warmed ("its sidecar did not become
ready in time") and served cold. A pod deleted while it starts ends the task (no warm request, no
mark left); so does one not Ready within ``START_TIMEOUT_S``. The warm request carries the fleet's
control token from the fleet's Redis (a real Valkey: the operator reads it there).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kopf
import kubernetes
import pytest
import redis
from kopf._core.engines import posting

from prefixfleet.operator import autoscale_handlers
from prefixfleet.operator.autoscale import SubtreeObservation
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    prewarm_replica,
)
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import ANNOTATION_STATE, FleetRef
from prefixfleet.router.control import CONTROL_HEADER
from prefixfleet.router.keys import FleetKeys
from tests.fleet_fixtures import RedisServer, eventually
from tests.k8s.apiserver import ApiServerThread
from tests.test_autoscale_e2e import FLEET, SIDECAR_PORT, replica_pod

HOLDER, NEW = f"{FLEET}-replica-0", f"{FLEET}-replica-1"
SID = "00000000c0ffee00"
WARM_BUDGET_S = 1.0  # the warm requests' budget in these tests; the pod takes longer to start


class Sidecars:
    """Every pod's sidecar: ``/prefixfleet/status`` says the engine is up, ``/prefixfleet/warm``
    warms whatever it is asked (the sidecar's side is tests/test_prewarm_sidecar.py)."""

    def __init__(self) -> None:
        self.warm_requests: list[tuple[str, dict[str, Any]]] = []
        self.warm_tokens: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/prefixfleet/status":
            return httpx.Response(200, json={"engine_ok": True})
        if request.url.path == "/prefixfleet/warm":
            body = json.loads(request.content)
            self.warm_requests.append((str(request.url.port), body))
            self.warm_tokens.append(request.headers.get(CONTROL_HEADER))
            results = {h: {"status": "ok", "tokens": 64, "cached_before": 0} for h in body["hashes"]}
            return httpx.Response(200, json={"worker_id": NEW, "state": "ready", "warmed_tokens": 64,
                                             "results": results})  # fmt: skip
        return httpx.Response(404)


class Harness:
    def __init__(self, api: ApiServerThread, redis_url: str) -> None:
        self.redis_url = redis_url  # the fleet's
        self.kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url)))
        self.sidecars = Sidecars()
        self.ctx = OperatorContext(kube=self.kube)
        self.auto = AutoscaleContext(
            OperatorMetrics(), httpx.AsyncClient(transport=httpx.MockTransport(self.sidecars))
        )
        self.events: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
        posting.settings_var.set(kopf.OperatorSettings())
        posting.event_queue_var.set(self.events)
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        self.kube.create(replica_pod(HOLDER, "http://127.0.0.1:41000"))

    def start_new_pod(self) -> None:
        """The reconcile's new pod: scheduled, its containers not Ready yet."""
        pod = replica_pod(NEW, "http://127.0.0.1:41001")
        pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        self.kube.create(pod)

    def make_ready(self) -> None:
        status = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        self.kube.request("PATCH", self.kube.path("Pod", "default", NEW, "status"), body=status,
                          content_type="application/merge-patch+json")  # fmt: skip

    def mark(self) -> str | None:
        pod = self.kube.get("Pod", "default", NEW) or {}
        return (pod.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_STATE)

    def prewarm(
        self, target: str = "new-0", holders: frozenset[str] = frozenset({HOLDER})
    ) -> asyncio.Task[None]:
        ref = FleetRef(name=FLEET, namespace="default", uid="fleet-uid")
        body = {"apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet",
                "metadata": {"name": FLEET, "namespace": "default", "uid": ref.uid}}  # fmt: skip
        subtrees = [SubtreeObservation(SID, tokens=64, rate_rps=1.0, holders=holders)]
        return asyncio.create_task(
            prewarm_replica(self.ctx, self.auto, FleetAutoscale(redis_url=self.redis_url), body, ref,
                            SIDECAR_PORT, target, [SID], subtrees, {HOLDER}, logging.getLogger("test"))
        )  # fmt: skip

    def stored_token(self) -> str | None:
        """What ``redis-cli GET pf:{fleet}:control`` answers."""
        ref = FleetRef(name=FLEET, namespace="default", uid="fleet-uid")
        with redis.Redis.from_url(self.redis_url) as client:
            value = client.get(FleetKeys(ref.redis_fleet).control)
        return value.decode() if value is not None else None

    def posted(self) -> list[posting.K8sEvent]:
        out = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    def reasons(self) -> list[str]:
        return [event.reason for event in self.posted()]


@pytest.fixture
async def harness(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer) -> AsyncIterator[Harness]:
    monkeypatch.setattr(autoscale_handlers, "WARM_TIMEOUT_S", WARM_BUDGET_S)
    api = ApiServerThread().start()
    h = Harness(api, redis_server.url)
    try:
        yield h
    finally:
        await h.auto.http.aclose()
        for client in h.ctx.redis_clients.values():
            await client.aclose()
        api.stop()


async def test_a_pod_ready_after_the_warm_budget_is_still_warmed_before_it_serves(harness: Harness) -> None:
    task = harness.prewarm()
    harness.start_new_pod()
    await eventually(harness.mark, 20, "the new pod to be marked warming", done=lambda m: m == "warming")
    # the pod takes longer to start than the warm requests' budget (the task may end meanwhile: the bug)
    await asyncio.wait([task], timeout=3 * WARM_BUDGET_S)
    assert harness.mark() == "warming"  # still held: not serving before it is warm
    harness.make_ready()
    await asyncio.wait_for(task, 30)
    assert [body["hold_traffic"] for _, body in harness.sidecars.warm_requests] == [True]
    assert harness.sidecars.warm_requests[0][0] == "41001"  # the new pod was warmed...
    assert harness.sidecars.warm_requests[0][1]["source"] == "http://127.0.0.1:41000"  # ...from the holder
    assert harness.sidecars.warm_tokens == [harness.stored_token()] != [None]  # with the fleet's token
    assert harness.reasons() == ["Prewarmed"]
    assert harness.mark() is None  # then serves


async def test_a_pod_deleted_while_it_starts_ends_the_warm_up(harness: Harness) -> None:
    task = harness.prewarm()
    harness.start_new_pod()
    await eventually(harness.mark, 20, "the new pod to be marked warming", done=lambda m: m == "warming")
    harness.kube.delete("Pod", "default", NEW)
    await asyncio.wait_for(task, 30)
    assert harness.sidecars.warm_requests == [] and harness.reasons() == []


async def test_a_pod_never_ready_is_given_up_after_the_start_timeout(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autoscale_handlers, "START_TIMEOUT_S", 1.0)
    task = harness.prewarm()
    harness.start_new_pod()
    await asyncio.wait_for(task, 30)
    assert harness.sidecars.warm_requests == []
    assert harness.mark() is None  # no mark left behind: once Ready it serves, cold


async def test_a_prefix_no_ready_pod_holds_is_reported_not_warmed(harness: Harness) -> None:
    # the subtree's only holder is gone (hung, drained): nothing to copy it from, no warm request
    await asyncio.wait_for(harness.prewarm(target=HOLDER, holders=frozenset({"gone-replica"})), 30)
    assert harness.sidecars.warm_requests == []
    [event] = harness.posted()
    assert (event.reason, event.type) == ("Prewarmed", "Warning"), event
    assert event.message == (
        f"pod {HOLDER}: 0 tokens of 0 hot prefix(es) warmed, 1 failed (1 with no ready holder to copy from)"
    )
