"""The autoscaler's current decision in the fleet's status, written by the operator's kopf handlers
(in-process: the kopf timer and event handler functions against the emulated API server and a
real Valkey holding the pods' load records, each written status checked against the generated CRD;
the operator's clock is a fake advanced 5 s per round, so the test waits on nothing).

Specification (a fleet of 2 Ready replicas, minReplicas 1, maxReplicas 2):
* every replica waits past saturation: the status says ``Hold``, ``limitedBy: TooManyReplicas``,
  ``reason: saturated, at maxReplicas`` — the answer to "why is my fleet not scaling up?";
* the load goes: the decision turns ``ScaleDownStabilizing`` ("quiet for 0s") at once; then the
  fleet is not written again while only the counter moves ("quiet for 5s", "10s", ...), until the
  memory's refresh (30 s) writes the current count with it (the ``since`` of the quiet period kept);
* a new operator process (restarted, failed over) writes it on its first round, with the same
  ``since`` (read back from the status);
* autoscaling switched off: the decision is removed from the status (the memory stays).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import kopf
import pytest
import redis
import yaml
from kopf._core.engines import posting

from prefixfleet.operator import autoscale_handlers
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    OperatorMetrics,
    autoscale_forget,
    autoscale_timer,
)
from prefixfleet.operator.crd_admission import crd_schema, schema_errors
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.kube import Kube
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, encode_record
from tests.fleet_fixtures import free_port
from tests.k8s.cluster import running_redis
from tests.test_autoscale_e2e import FLEET, replica_pod
from tests.test_autoscale_round_races import CRD, FLEET_PATH, IDLE, fleet_manifest, kube

__all__ = ["kube"]  # the fixture: the emulated API server with the CRD

PODS = (f"{FLEET}-replica-0", f"{FLEET}-replica-1")
# 40000 tokens to prefill at 4000 tokens/s: a request arriving now waits 10 s (target TTFT 1 s)
BUSY = LoadReport(
    seq=2, ts=0.0, state="ready", engine_ok=True, in_flight=8, queued=8, pending_prefill_tokens=40000,
    prefill_tokens_per_s=4000.0, cached_tokens=0, capacity_tokens=60000, summary_version=0,
)  # fmt: skip
ROUND_S = 5.0  # the fake clock's step per round


class FakeClock:
    """``time`` as autoscale_handlers sees it: time() advanced by hand, the rest the real module."""

    def __init__(self) -> None:
        # whole seconds: the status keeps milliseconds, and a time rounded up by it would put the
        # memory's refresh (30 s after the write it reads back) one round later
        self.now = float(int(time.time()))

    def module(self) -> SimpleNamespace:
        return SimpleNamespace(time=lambda: self.now, monotonic=time.monotonic, strftime=time.strftime,
                               gmtime=time.gmtime)  # fmt: skip


class Operator:
    """The autoscaler's handlers for one fleet of two Ready pods; rounds run when told."""

    def __init__(self, kube: Kube, redis_url: str, clock: FakeClock) -> None:
        self.kube, self.redis_url, self.clock = kube, redis_url, clock
        self.memo = kopf.Memo()
        self.memo.ctx = OperatorContext(kube=kube)
        self.memo.autoscale = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient(timeout=2))
        self.logger = logging.getLogger("test.autoscale.decision")

    def load(self, record: LoadReport) -> None:
        keys = FleetKeys(f"default.{FLEET}")
        with redis.Redis.from_url(self.redis_url) as client:
            for name in PODS:
                client.set(keys.load(name), encode_record(record))

    def fleet(self) -> dict[str, Any]:
        body = self.kube.get("PrefixCacheFleet", "default", FLEET)
        assert body is not None
        return body

    async def round(self) -> dict[str, Any]:
        """One autoscaler round (the timer's next tick, ROUND_S later); returns the fleet after it."""
        self.clock.now += ROUND_S
        await autoscale_timer(body=kopf.Body(self.fleet()), memo=self.memo, logger=self.logger)
        return self.fleet()

    async def close(self) -> None:
        await self.memo.autoscale.http.aclose()
        for client in self.memo.ctx.redis_clients.values():
            await client.aclose()


STATUS_SCHEMA = crd_schema(yaml.safe_load(CRD.read_text()))["properties"]["status"]


def decision(fleet: dict[str, Any]) -> dict[str, Any] | None:
    """The fleet's status.autoscaler.decision; the status must be what the CRD accepts (as a real
    API server, the emulated one refuses a status patch its schema does not: checked here again)."""
    status = fleet.get("status") or {}
    assert schema_errors(STATUS_SCHEMA, status) == [], status
    return (status.get("autoscaler") or {}).get("decision")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(autoscale_handlers, "time", fake.module())
    yield fake


@pytest.fixture
async def operator(kube: Kube, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Operator]:
    with running_redis(tmp_path) as redis_url:
        manifest = fleet_manifest(redis_url)
        manifest["spec"]["autoscaling"].update(
            maxReplicas=2, targetTTFTSeconds=1.0, leadTimeSeconds=0, scaleDownStabilizationSeconds=3600
        )
        kube.request("POST", FLEET_PATH, body=manifest)
        for name in PODS:  # Ready pods whose sidecars are not there: no engine rates, records only
            kube.create(replica_pod(name, f"http://127.0.0.1:{free_port()}"))
        posting.settings_var.set(kopf.OperatorSettings())  # a round may post Events
        posting.event_queue_var.set(asyncio.Queue())
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        op = Operator(kube, redis_url, clock)
        try:
            yield op
        finally:
            await op.close()


@pytest.mark.timeout(120)
async def test_the_status_says_why_the_fleet_does_not_scale_without_a_write_per_round(
    operator: Operator,
) -> None:
    operator.load(BUSY)
    fleet = await operator.round()
    assert fleet["spec"]["replicas"] == 2  # nothing to do: at maxReplicas
    saturated = decision(fleet)
    assert saturated is not None, fleet.get("status")
    assert (saturated["action"], saturated.get("limitedBy"), saturated["reason"]) == (
        "Hold", "TooManyReplicas", "saturated, at maxReplicas"
    ), saturated  # fmt: skip

    # quiet: the new limit is written at once
    operator.load(IDLE)
    fleet = await operator.round()
    quiet = decision(fleet)
    assert quiet is not None and quiet["limitedBy"] == "ScaleDownStabilizing", quiet
    assert quiet["reason"].startswith("quiet for 0s"), quiet
    version = fleet["metadata"]["resourceVersion"]

    # only the counter moves: no write until the memory's refresh, 30 s after the last write
    for _ in range(5):
        fleet = await operator.round()
        assert fleet["metadata"]["resourceVersion"] == version, (decision(fleet), fleet["status"])
    fleet = await operator.round()
    refreshed = decision(fleet)
    assert fleet["metadata"]["resourceVersion"] != version
    assert refreshed is not None and refreshed["reason"].startswith("quiet for 30s"), refreshed
    assert refreshed["since"] == quiet["since"] and refreshed["observedTime"] != quiet["observedTime"]
    assert refreshed["limitedBy"] == "ScaleDownStabilizing"

    # another operator (restarted, failed over) rewrites it at once, keeping its start
    successor = Operator(operator.kube, operator.redis_url, operator.clock)
    try:
        fleet = await successor.round()
    finally:
        await successor.close()
    taken_over = decision(fleet)
    assert taken_over is not None and taken_over["reason"].startswith("quiet for 35s"), taken_over
    assert taken_over["since"] == quiet["since"], taken_over

    # autoscaling switched off: the decision goes (nothing keeps it current), the memory stays
    operator.kube.merge_patch(
        "PrefixCacheFleet", "default", FLEET, {"spec": {"autoscaling": {"enabled": False}}}
    )
    body = operator.fleet()
    await autoscale_forget(body=kopf.Body(body), memo=operator.memo, type="MODIFIED", logger=operator.logger)
    status = operator.fleet()["status"]
    assert "decision" not in status["autoscaler"] and status["autoscaler"]["memory"], status
