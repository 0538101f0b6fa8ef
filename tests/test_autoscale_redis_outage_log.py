"""The autoscaler's rounds while the fleet's Redis is down (in-process: the kopf timer function
against the emulated API server, the fleet's spec.redis.url a closed port).

Specification: a round that cannot read Redis is skipped (the next one retries), and the outage is
one warning when it begins and one info line when rounds run again, not a warning every
``intervalSeconds`` per fleet (the reconcile's Degraded condition shows it meanwhile). Before, each
skipped round logged the same warning.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import kopf
import pytest
from kopf._core.engines import posting

from prefixfleet.operator.autoscale_handlers import AutoscaleContext, OperatorMetrics, autoscale_timer
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.kube import Kube
from tests.fleet_fixtures import free_port
from tests.k8s.cluster import running_redis
from tests.test_autoscale_e2e import FLEET, replica_pod
from tests.test_autoscale_round_races import FLEET_PATH, fleet_manifest, kube

__all__ = ["kube"]  # the fixture: the emulated API server with the CRD


async def test_a_redis_outage_is_one_warning_not_one_per_round(
    kube: Kube, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    kube.request("POST", FLEET_PATH, body=fleet_manifest(dead))
    for i in range(2):
        kube.create(replica_pod(f"{FLEET}-replica-{i}", f"http://127.0.0.1:{free_port()}"))  # no sidecar
    posting.settings_var.set(kopf.OperatorSettings())  # the rounds post Events (a scale-down here)
    posting.event_queue_var.set(asyncio.Queue())
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    memo = kopf.Memo()
    memo.ctx = OperatorContext(kube=kube)
    memo.autoscale = auto = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient())
    logger = logging.getLogger("test.autoscale.outage")

    async def tick() -> None:
        body = kube.get("PrefixCacheFleet", "default", FLEET)
        assert body is not None
        for state in auto.fleets.values():
            state.last_round = 0.0  # a round is due at every tick of this test
        await autoscale_timer(body=kopf.Body(body), memo=memo, logger=logger)

    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            for _ in range(3):
                await tick()
        skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
        assert [r.levelno for r in skipped] == [logging.WARNING], [r.getMessage() for r in skipped]
        assert skipped[0].getMessage().startswith(f"autoscaler rounds for default/{FLEET} skipped: Error")
        # Redis is back (here: the fleet names one that answers): one line says so, then silence
        caplog.clear()
        with running_redis(tmp_path) as redis_url, caplog.at_level(logging.INFO, logger=logger.name):
            kube.merge_patch("PrefixCacheFleet", "default", FLEET, {"spec": {"redis": {"url": redis_url}}})
            for _ in range(2):
                await tick()
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autoscaler rounds")]
        assert lines == [f"autoscaler rounds for default/{FLEET} run again"], lines
    finally:
        await auto.http.aclose()
        for client in memo.ctx.redis_clients.values():
            await client.aclose()
