"""The local fleet's autoscaler and replica reaper say a Redis error as router.redis_conn does: Redis
before 6 refusing redis-py's ``HELLO 3 AUTH <user> <password>`` repeats the password in its text
(``unknown command `HELLO`, with args beginning with: ...``), which must never reach a log line."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from redis.exceptions import ResponseError

from prefixfleet.fleet import reaper as reaper_module
from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.fleet.reaper import Reaping, ReplicaReaper
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.router.redis_conn import OLDER_THAN_6

SECRET = "hunter2-s3cret"
# What Redis 5 answers redis-py >= 8's first command on a connection with a password
REDIS5_REFUSAL = f"unknown command `HELLO`, with args beginning with: `3`, `AUTH`, `default`, `{SECRET}`, "


def _fleet() -> Any:
    # the loops only connect lazily (from_url): no server needed for an error path
    return SimpleNamespace(redis_url="redis://127.0.0.1:1/0", spec=SimpleNamespace(fleet_name="local"))


def _assert_said_plainly(lines: list[str]) -> None:
    assert lines, "no line was said"
    for line in lines:
        assert SECRET not in line, line
        assert OLDER_THAN_6 in line, line


async def test_a_round_skipped_for_redis_says_why_without_its_password() -> None:
    autoscaler = LocalAutoscaler(_fleet(), ScalePolicy(min_replicas=1, max_replicas=2))
    stop = asyncio.Event()

    async def failing_round(*_args: Any) -> None:
        stop.set()
        raise ResponseError(REDIS5_REFUSAL)

    autoscaler.round = failing_round  # type: ignore[method-assign]
    await asyncio.wait_for(autoscaler.run(stop), 30)
    errors = [e.detail for e in autoscaler.events if e.action == "error"]
    assert [e.startswith("round skipped: ") for e in errors] == [True]
    _assert_said_plainly(errors)


async def test_a_failed_replica_start_says_its_redis_error_without_the_password() -> None:
    autoscaler = LocalAutoscaler(_fleet(), ScalePolicy(min_replicas=1, max_replicas=2))

    async def _add_replica() -> None:  # as a start whose arrival read (arrived_to) met that Redis
        raise ResponseError(REDIS5_REFUSAL)

    autoscaler._spawn(_add_replica())
    await asyncio.wait_for(asyncio.gather(*autoscaler.tasks, return_exceptions=True), 30)
    await asyncio.sleep(0)  # the done callback runs on the next loop iteration
    errors = [e.detail for e in autoscaler.events if e.action == "error"]
    assert [e.startswith("_add_replica: ResponseError: ") for e in errors] == [True], errors
    _assert_said_plainly(errors)


async def test_the_reaper_says_a_failed_deregistration_without_the_password(monkeypatch) -> None:
    replica = SimpleNamespace(worker_id="replica-1")

    async def stop_replica(_replica: Any) -> None:
        return None

    fleet = _fleet()
    fleet.stop_replica, fleet.replicas = stop_replica, [replica]

    async def deregister_worker(*_args: Any) -> None:
        raise ResponseError(REDIS5_REFUSAL)

    monkeypatch.setattr(reaper_module, "deregister_worker", deregister_worker)
    said: list[str] = []
    reaper = ReplicaReaper(fleet, say=said.append)
    await reaper._remove(replica, None, Reaping("replica-1", (), restart=False, why="test"))  # type: ignore[arg-type]
    errors = [e.detail for e in reaper.events if e.action == "error"]
    assert len(errors) == 1 and errors[0].startswith("replica-1: could not remove its member from Redis: ")
    _assert_said_plainly(errors)
    assert SECRET not in "\n".join(said)


async def test_a_failed_sweep_says_its_redis_error_without_the_password() -> None:
    said: list[str] = []
    reaper = ReplicaReaper(_fleet(), say=said.append)
    stop = asyncio.Event()

    async def sweep(_redis: Any) -> None:
        stop.set()
        raise ResponseError(REDIS5_REFUSAL)

    reaper.sweep = sweep  # type: ignore[method-assign]
    await asyncio.wait_for(reaper.run(stop), 30)
    _assert_said_plainly([e.detail for e in reaper.events if e.action == "error"])
    assert SECRET not in "\n".join(said)
