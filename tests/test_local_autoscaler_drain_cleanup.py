"""A local drain or warm-up that goes wrong still ends: the replica is not left "draining" or
"warming" for good (it would be observed so by every later round, as would a later replica of the
same name), and a sidecar status of an unexpected shape does not stop the drain halfway.

Every state change and warm request carries the fleet's control token, the value of
``pf:{fleet}:control`` in the fleet's Redis (a real Valkey here); with that Redis unreachable, a
drain or warm-up fails before it changes anything, and says why."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from prefixfleet.fleet import autoscale
from prefixfleet.fleet.autoscale import LocalAutoscaler, in_flight
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.router.control import CONTROL_HEADER
from prefixfleet.router.keys import FleetKeys
from tests.fleet_fixtures import RedisServer


class FakeFleet:
    def __init__(self, *, stop_fails: bool = False) -> None:
        self.replicas: list[Any] = []
        self.spec = SimpleNamespace(fleet_name="cleanup")
        self.stopped: list[str] = []
        self.stop_fails = stop_fails

    async def stop_replica(self, replica: Any) -> None:
        if self.stop_fails:
            raise RuntimeError("the process would not stop")
        self.stopped.append(replica.worker_id)


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    async with aioredis.from_url(redis_server.url) as client:
        yield client


async def stored_token(redis: aioredis.Redis) -> str:
    """What ``redis-cli GET pf:cleanup:control`` answers."""
    value = await redis.get(FleetKeys("cleanup").control)
    assert value is not None, "no control token in the fleet's Redis"
    return str(value.decode())


def sidecar(
    status: Any, posted: list[Any] | None = None, tokens: list[Any] | None = None
) -> httpx.AsyncClient:
    """An HTTP client whose sidecar answers every status poll with ``status`` (state posts: 200,
    their bodies appended to ``posted``, their control tokens to ``tokens``)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/prefixfleet/status":
            return httpx.Response(200, content=json.dumps(status).encode())
        if posted is not None:
            posted.append(json.loads(request.content))
        if tokens is not None:
            tokens.append(request.headers.get(CONTROL_HEADER))
        return httpx.Response(200, json={})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def draining_scaler(fleet: FakeFleet) -> tuple[LocalAutoscaler, Any]:
    replica = SimpleNamespace(index=0, worker_id="replica-0", sidecar_url="http://sidecar")
    fleet.replicas.append(replica)
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=0, max_replicas=2), interval_s=0.5)  # type: ignore[arg-type]
    scaler.draining.add(replica.worker_id)
    scaler.reserved.add(replica.index)
    return scaler, replica


@pytest.fixture(autouse=True)
def no_minimum_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    # the 2 s a real drain waits for the gateways' views is not what these tests are about
    monkeypatch.setattr(autoscale, "MIN_DRAIN_S", 0.0)


@pytest.mark.parametrize("status", [[], "busy", {"load": []}, {"load": {"in_flight": 0}}])
async def test_a_status_of_any_shape_ends_the_drain_and_stops_the_replica(
    status: Any, redis: aioredis.Redis
) -> None:
    fleet = FakeFleet()
    scaler, replica = draining_scaler(fleet)
    async with sidecar(status) as http:
        await scaler._drain(replica, http, redis)
    assert fleet.stopped == ["replica-0"]
    assert fleet.replicas == []
    assert "replica-0" not in scaler.draining
    assert replica.index not in scaler.reserved


async def test_a_stop_that_fails_leaves_a_serving_replica_not_one_marked_draining(
    redis: aioredis.Redis,
) -> None:
    fleet = FakeFleet(stop_fails=True)
    scaler, replica = draining_scaler(fleet)
    posted: list[Any] = []
    tokens: list[Any] = []
    async with sidecar({"load": {"in_flight": 0}}, posted, tokens) as http:
        with pytest.raises(RuntimeError, match="would not stop"):
            await scaler._drain(replica, http, redis)
    assert "replica-0" not in scaler.draining
    assert replica.index not in scaler.reserved
    # still in the fleet, so observed as serving: its sidecar takes traffic again
    assert fleet.replicas == [replica]
    assert posted == [{"state": "draining"}, {"state": "ready"}]
    assert tokens == [await stored_token(redis)] * 2


async def test_a_drain_whose_token_cannot_be_read_changes_nothing(tmp_path: Path) -> None:
    fleet = FakeFleet()
    scaler, replica = draining_scaler(fleet)
    posted: list[Any] = []
    gone = aioredis.from_url(f"unix://{tmp_path}/no-redis.sock")  # the fleet's Redis is unreachable
    async with sidecar({"load": {"in_flight": 0}}, posted) as http:
        with pytest.raises(RedisConnectionError):  # said as an "error" event by the task's callback
            await scaler._drain(replica, http, gone)
    await gone.aclose()
    assert posted == [] and fleet.stopped == [] and fleet.replicas == [replica]  # still serving
    assert "replica-0" not in scaler.draining and replica.index not in scaler.reserved


async def test_a_warm_up_that_fails_leaves_nothing_marked_warming(
    monkeypatch: pytest.MonkeyPatch, redis: aioredis.Redis
) -> None:
    warm_tokens: list[Any] = []

    async def broken_warm_replica(*args: Any, **kwargs: Any) -> Any:
        warm_tokens.append(kwargs.get("control_token"))
        raise RuntimeError("the holder answered garbage")

    monkeypatch.setattr(autoscale, "warm_replica", broken_warm_replica)
    fleet = FakeFleet()
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=0, max_replicas=2), interval_s=0.5)  # type: ignore[arg-type]
    posted: list[Any] = []
    tokens: list[Any] = []
    async with sidecar(None, posted, tokens) as http:
        with pytest.raises(RuntimeError, match="garbage"):
            await scaler._warm("replica-1", "http://sidecar", ["s"], [], http, redis, new=True)
    assert "replica-1" not in scaler.warming
    assert posted == [{"state": "warming"}, {"state": "ready"}]  # it takes traffic again
    token = await stored_token(redis)
    assert tokens == [token, token] and warm_tokens == [token]


async def test_a_warm_up_whose_token_cannot_be_read_changes_nothing(tmp_path: Path) -> None:
    fleet = FakeFleet()
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=0, max_replicas=2), interval_s=0.5)  # type: ignore[arg-type]
    scaler.prewarming.add("replica-0")
    posted: list[Any] = []
    gone = aioredis.from_url(f"unix://{tmp_path}/no-redis.sock")
    async with sidecar(None, posted) as http:
        with pytest.raises(RedisConnectionError):
            await scaler._warm("replica-0", "http://sidecar", ["s"], [], http, gone, new=True)
    await gone.aclose()
    assert posted == []  # never marked warming, so it serves as before
    assert not scaler.warming and not scaler.prewarming


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"load": {"in_flight": 2}}, True),
        ({"load": {"in_flight": 0}}, False),
        ({"load": {}}, False),
        ({}, False),
        ([], False),
        (None, False),
        ({"load": "x"}, False),
    ],
)
def test_in_flight_reads_only_a_status_of_the_sidecars_shape(status: Any, expected: bool) -> None:
    assert in_flight(status) is expected
