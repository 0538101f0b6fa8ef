"""A fleet process that dies during a policy's replay ends `prefixfleet up` at once, naming it: the
replay through a fleet that lost a process is no measurement. Before, the replay ran on to its end
(20 s of `up`'s default workload, minutes of a long trace) and only then was the process named."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from prefixfleet.fleet import local
from prefixfleet.fleet.local import FleetSpec, LocalFleet, UpOptions, run_policies
from prefixfleet.fleet.processes import ChildFailedError, Supervisor


class NoGateways(LocalFleet):
    """The fleet without its HTTP side: what run_policies does around the replay is not under test."""

    async def reset(self) -> None:
        return None

    async def start_gateways(self, policy: str) -> None:
        self.gateways = []


async def test_a_process_killed_mid_replay_ends_the_run_naming_it(tmp_path: Path, monkeypatch) -> None:
    replaying = asyncio.Event()
    ended: list[str] = []

    async def endless_replay(*_args: Any, **_kwargs: Any) -> Any:  # a replay far longer than any wait
        replaying.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cancelled")

    monkeypatch.setattr(local, "run_load", endless_replay)
    async with Supervisor(tmp_path) as sup:
        engine = await sup.start("engine-0", ["sleep", "300"])
        fleet = NoGateways(sup, FleetSpec(replicas=1, gateways=1))
        options = UpOptions(policies=("round_robin",))
        run = asyncio.create_task(run_policies(fleet, [], options.policies, options))
        await asyncio.wait_for(replaying.wait(), 30)
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(ChildFailedError) as err:
            await asyncio.wait_for(run, 60)  # before: the replay goes on, and this times out
    assert err.value.name == "engine-0"
    assert err.value.message == "exited unexpectedly with status -9 (SIGKILL)"
    assert ended == ["cancelled"]  # the replay does not outlive the error


async def test_a_replay_that_ends_returns_its_result(tmp_path: Path) -> None:
    async def replay() -> str:
        await asyncio.sleep(0)
        return "run"

    async with Supervisor(tmp_path) as sup:
        await sup.start("engine-0", ["sleep", "300"])
        assert await sup.while_alive(replay()) == "run"
