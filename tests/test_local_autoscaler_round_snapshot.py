"""A local autoscaler round counts the fleet at one moment.

A round takes the fleet's replicas, then awaits Redis and the engines' metrics (seconds on a loaded
machine), then adds the replicas still starting. A replica that finished starting during those awaits
moved from "starting" into the fleet after the snapshot of the fleet was taken: counted in neither, the
round saw one replica too few and ordered a second ``below minReplicas`` scale-up (seen in loaded
parallel runs of tests/test_fleet_reaper_live.py, 6.7 s after the first).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import RedisServer

from prefixfleet.fleet import autoscale
from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.operator.autoscale import ScalePolicy


def replica(index: int) -> SimpleNamespace:
    # the fields a round reads; no sidecar URL, so no engine metrics are fetched
    return SimpleNamespace(index=index, worker_id=f"replica-{index}", sidecar_url=None)


@pytest.mark.timeout(60)
async def test_a_replica_that_finishes_starting_mid_round_is_counted_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet: Any = SimpleNamespace(replicas=[replica(0)], spec=SimpleNamespace(fleet_name="snap"))
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=2, max_replicas=3), interval_s=0.5)
    scaler.starting = 1  # replica-1 is on its way (ordered by an earlier round)
    real_read_records = autoscale.read_records

    async def read_records_while_replica_1_arrives(*args: Any, **kwargs: Any) -> Any:
        result = await real_read_records(*args, **kwargs)
        # what _add_replica does when the start completes, with no await in between
        fleet.replicas.append(replica(1))
        scaler.starting -= 1
        return result

    monkeypatch.setattr(autoscale, "read_records", read_records_while_replica_1_arrives)
    redis = aioredis.from_url(redis_server.url)
    try:
        async with httpx.AsyncClient() as http:
            plan = await scaler.round(redis, http)
    finally:
        await redis.aclose()
    assert plan.add == 0, plan.reason
    assert not [e for e in scaler.events if e.action == "scale_up"], scaler.events
    # and a round with the fleet really below its minimum still scales up
    fleet.replicas.pop()
    redis = aioredis.from_url(redis_server.url)
    try:
        async with httpx.AsyncClient() as http:
            monkeypatch.setattr(autoscale, "read_records", real_read_records)
            plan = await scaler.round(redis, http)
    finally:
        await redis.aclose()
    assert plan.add == 1 and plan.reason == "below minReplicas (1 < 2)", plan
    for task in list(scaler.tasks):  # the replica it ordered: the fake fleet cannot start one
        task.cancel()
