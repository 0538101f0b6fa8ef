"""A local autoscaler round counts the fleet at one moment, and carries out its plan on that fleet.

A round takes the fleet's replicas, then awaits Redis and the engines' metrics (seconds on a loaded
machine), then observes them. Meanwhile the replicas it started and drained keep moving:

* a replica that finished starting moved from "starting" into the fleet after the snapshot of the
  fleet was taken: counted in neither, the round saw one replica too few and ordered a second
  ``below minReplicas`` scale-up (seen in loaded parallel runs of tests/test_fleet_reaper_live.py,
  6.7 s after the first);
* a drain that completed took its replica out of the fleet *and* out of ``draining``: with
  ``draining`` read after the awaits, the drained replica counted as a serving one (with
  ``maxReplicas`` reached: a second, real scale-down);
* a replica the plan names may by then be another process under the same name (the observed one
  reaped, its index reused): a drain must not stop that one, and the round observes the creation
  time of the replica it counted, not the newcomer's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import RedisServer

from prefixfleet.fleet import autoscale
from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.fleet.local import EngineSettings
from prefixfleet.operator.autoscale import ScalePlan, ScalePolicy


def replica(index: int, sidecar_url: str | None = None) -> SimpleNamespace:
    # the fields a round reads; no sidecar URL, so no engine metrics are fetched
    return SimpleNamespace(index=index, worker_id=f"replica-{index}", sidecar_url=sidecar_url)


def fake_fleet(*replicas: SimpleNamespace) -> Any:
    # the engines speak SGLang's API, as `prefixfleet up` runs them by default
    spec = SimpleNamespace(fleet_name="snap", engine=EngineSettings())
    return SimpleNamespace(replicas=list(replicas), spec=spec)


async def one_round(
    scaler: LocalAutoscaler,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    during_read: Callable[[], None] = lambda: None,
) -> ScalePlan:
    """One round on a real Valkey, with ``during_read`` run inside its Redis read (after the read,
    before the round goes on)."""
    real_read_records = autoscale.read_records

    async def read_records_and_change(*args: Any, **kwargs: Any) -> Any:
        result = await real_read_records(*args, **kwargs)
        during_read()
        return result

    monkeypatch.setattr(autoscale, "read_records", read_records_and_change)
    redis = aioredis.from_url(redis_server.url)
    try:
        async with httpx.AsyncClient() as http:
            return await scaler.round(redis, http)
    finally:
        await redis.aclose()
        monkeypatch.setattr(autoscale, "read_records", real_read_records)


@pytest.mark.timeout(60)
async def test_a_replica_that_finishes_starting_mid_round_is_counted_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = fake_fleet(replica(0))
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=2, max_replicas=3), interval_s=0.5)
    scaler.starting = 1  # replica-1 is on its way (ordered by an earlier round)

    def replica_1_arrives() -> None:
        # what _add_replica does when the start completes, with no await in between
        fleet.replicas.append(replica(1))
        scaler.starting -= 1

    plan = await one_round(scaler, redis_server, monkeypatch, replica_1_arrives)
    assert plan.add == 0, plan.reason
    assert not [e for e in scaler.events if e.action == "scale_up"], scaler.events
    # and a round with the fleet really below its minimum still scales up
    fleet.replicas.pop()
    plan = await one_round(scaler, redis_server, monkeypatch)
    assert plan.add == 1 and plan.reason == "below minReplicas (1 < 2)", plan
    for task in list(scaler.tasks):  # the replica it ordered: the fake fleet cannot start one
        task.cancel()


@pytest.mark.timeout(60)
async def test_a_drain_that_completes_mid_round_is_not_counted_as_a_serving_replica(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    draining = replica(2)
    fleet = fake_fleet(replica(0), replica(1), draining)
    # at its maximum once replica-2 (drained by an earlier round: maxReplicas was lowered) has gone
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=1, max_replicas=2), interval_s=0.5)
    scaler.draining.add(draining.worker_id)

    def replica_2_goes() -> None:
        # what _drain does once the replica has stopped, with no await in between
        fleet.replicas.remove(draining)
        scaler.draining.discard(draining.worker_id)

    plan = await one_round(scaler, redis_server, monkeypatch, replica_2_goes)
    # counted as serving, it made three replicas against a maximum of two: a second scale-down
    assert plan.drain == () and plan.desired_replicas == 2, plan
    assert scaler.observed is not None
    phases = {r.replica_id: r.phase for r in scaler.observed.replicas}
    assert phases == {"replica-0": "ready", "replica-1": "ready", "replica-2": "draining"}, phases


@pytest.mark.timeout(60)
async def test_a_name_reused_mid_round_keeps_the_observed_replicas_creation_time(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = fake_fleet(replica(0), replica(1))
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=1, max_replicas=3), interval_s=0.5)
    scaler.created.update({"replica-0": 1000.0, "replica-1": 2000.0})

    def replica_1_is_replaced() -> None:
        # reaped, and a start ordered earlier came up under the freed index (as _add_replica does)
        fleet.replicas[1] = replica(1, "http://127.0.0.1:9/new")
        scaler.created["replica-1"] = 3000.0

    await one_round(scaler, redis_server, monkeypatch, replica_1_is_replaced)
    assert scaler.observed is not None
    created = {r.replica_id: r.created_s for r in scaler.observed.replicas}
    assert created == {"replica-0": 1000.0, "replica-1": 2000.0}, created


@pytest.mark.timeout(60)
async def test_a_drain_is_not_carried_out_on_a_new_replica_under_the_victims_name() -> None:
    observed = replica(1, "http://127.0.0.1:9/old")  # what the round saw (never contacted after the fix)
    fleet = fake_fleet(replica(0, "http://127.0.0.1:9/r0"))
    stopped: list[Any] = []

    async def stop_replica(r: Any) -> None:
        stopped.append(r)

    fleet.stop_replica = stop_replica
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=1, max_replicas=2), interval_s=0.5)
    # during the round's awaits replica-1 died and was reaped, and a start ordered earlier came up
    # under the free index 1: another process, serving, never asked to drain
    newcomer = replica(1, "http://127.0.0.1:9/new")
    fleet.replicas.append(newcomer)
    plan = ScalePlan(desired_replicas=1, drain=(observed.worker_id,), reason="test: scale down by 1")

    def nothing_answers(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(nothing_answers)) as http:
        urls = {observed.worker_id: observed.sidecar_url}
        await scaler.execute(plan, (), urls, http, redis=None)  # type: ignore[arg-type]
        await asyncio.wait_for(asyncio.gather(*scaler.tasks), 30)
    assert stopped == [] and newcomer in fleet.replicas, (stopped, scaler.events)
    assert not scaler.draining and not scaler.reserved
    assert not [e for e in scaler.events if e.action in ("scale_down", "drain", "removed")], scaler.events
