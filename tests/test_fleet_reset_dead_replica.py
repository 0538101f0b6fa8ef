"""Resetting the fleet between runs when a replica's process has died: the dead process is named at
once, with its log, not as "engine ... kept refusing /flush_cache" 10 s later."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from fleet_fixtures import eventually, free_port

from prefixfleet.fleet.local import FleetSpec, LocalFleet, Replica
from prefixfleet.fleet.processes import ChildFailedError, Supervisor, start_redis


async def _fleet_with_a_dead_sidecar(sup: Supervisor) -> LocalFleet:
    """One replica whose engine runs and whose sidecar was SIGKILLed (nothing listens at its URL)."""
    redis = await start_redis(sup)  # the flush carries the fleet's control token, kept there
    engine = await sup.start("engine-0", ["sleep", "300"])
    sidecar = await sup.start("sidecar-0", ["sh", "-c", "echo sidecar says goodbye; exec sleep 300"])
    await eventually(lambda: "goodbye" in sidecar.log_path.read_text(), 30, "the sidecar's log line")
    os.kill(sidecar.pid, signal.SIGKILL)
    await sidecar.process.wait()
    fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=1))
    fleet.redis = redis
    url = f"http://127.0.0.1:{free_port()}"  # refused, as a dead sidecar's
    fleet.replicas = [Replica(0, engine, f"http://127.0.0.1:{free_port()}", sidecar, url)]
    return fleet


async def test_a_sidecar_dead_before_a_reset_is_named_with_its_log(tmp_path: Path) -> None:
    # Before: `prefixfleet compare` with a sidecar killed mid-replay ended 28 s later with
    # "fleet process engine: http://127.0.0.1:39307 kept refusing /flush_cache for 10 s" (no log).
    async with Supervisor(tmp_path) as sup:
        fleet = await _fleet_with_a_dead_sidecar(sup)
        with pytest.raises(ChildFailedError) as err:
            await fleet.reset()
    assert err.value.name == "sidecar-0"
    assert err.value.message == "exited unexpectedly with status -9 (SIGKILL)"
    assert "sidecar says goodbye" in err.value.log_tail


async def test_a_dead_replica_the_reaper_handles_has_nothing_to_flush(tmp_path: Path) -> None:
    # while the fleet is held, the reaper takes a dead replica out: the hold's reset goes on
    async with Supervisor(tmp_path) as sup:
        fleet = await _fleet_with_a_dead_sidecar(sup)
        sup.exit_handled = fleet.is_replica_process
        await fleet.reset()
