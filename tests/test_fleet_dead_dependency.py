"""A fleet process that dies while another one starts is named at once, not the one left waiting."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from prefixfleet.fleet.processes import ChildFailedError, Supervisor

READY_TIMEOUT_S = 20.0


async def test_a_dependency_killed_while_a_child_starts_is_the_one_named(tmp_path: Path) -> None:
    # Before: Valkey SIGKILLed while a gateway started left the gateway unready ('redis unavailable')
    # and `prefixfleet up` said "gateway-0-round_robin: not ready after 60s" a minute later.
    async with Supervisor(tmp_path) as sup:
        redis = await sup.start("redis", ["sleep", "300"])
        os.kill(redis.pid, signal.SIGKILL)
        await redis.process.wait()

        async def never_ready() -> bool:
            return False

        with pytest.raises(ChildFailedError) as err:
            await sup.start("gateway-0", ["sleep", "300"], ready=never_ready, ready_timeout_s=READY_TIMEOUT_S)
        assert err.value.name == "redis"
        assert err.value.message == "exited unexpectedly with status -9 (SIGKILL)"
        assert [c.name for c in sup.children] == ["redis"]  # the waiting child was stopped


async def test_a_dead_process_someone_else_handles_does_not_stop_a_start(tmp_path: Path) -> None:
    # the fleet's reaper handles a dead replica while it restarts another: that start goes on
    async with Supervisor(tmp_path) as sup:
        dead = await sup.start("engine-1", ["sleep", "300"])
        os.kill(dead.pid, signal.SIGKILL)
        await dead.process.wait()
        sup.exit_handled = lambda child: child.name == "engine-1"
        calls = 0

        async def ready_on_the_third_probe() -> bool:
            nonlocal calls
            calls += 1
            return calls >= 3

        child = await sup.start("engine-2", ["sleep", "300"], ready=ready_on_the_third_probe)
        assert child.running and calls == 3
