"""`prefixfleet up --autoscale --prometheus local` when its Prometheus is missing, fails to start, or
dies while the fleet is held: one line each, never a traceback, and a dead Prometheus does not end the
fleet (the autoscaler reads the sidecars' /metrics meanwhile)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from prefixfleet.cli import main
from prefixfleet.fleet import cli as fleet_cli
from prefixfleet.fleet.autoscale import FleetPrometheus
from prefixfleet.fleet.processes import ChildFailedError
from prefixfleet.operator.autoscale import ScalePolicy


def test_a_missing_prometheus_binary_is_refused_before_the_run(tmp_path: Path, monkeypatch, capsys) -> None:
    # Before: the whole benchmark ran, then PrometheusNotFound's traceback (exit 1).
    monkeypatch.setenv("PATH", str(tmp_path))  # no prometheus there
    argv = ["up", "--requests", "10", "--replicas", "1", "--gateways", "1", "--no-sim-check", "--no-progress"]
    run_dir = tmp_path / "run"
    assert main([*argv, "--autoscale", "--prometheus", "local", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixfleet up: error: --prometheus local: prometheus is not on PATH"), err
    assert err.count("\n") == 1
    assert not run_dir.exists()


async def test_a_prometheus_that_does_not_start_is_the_fleet_process_named(
    tmp_path: Path, monkeypatch
) -> None:
    async def exits(self: FleetPrometheus) -> None:
        raise RuntimeError("prometheus exited with 1:\nerror loading config: bad\nlast line")

    monkeypatch.setattr(FleetPrometheus, "start", exits)
    spec, sup = SimpleNamespace(fleet_name="local"), SimpleNamespace(run_dir=tmp_path)
    fleet = SimpleNamespace(replicas=[], gateway_urls=[], spec=spec, sup=sup)
    with pytest.raises(ChildFailedError) as err:
        await fleet_cli._hold_autoscaled(fleet, ScalePolicy(min_replicas=1, max_replicas=2), 1.0, "local")
    assert err.value.name == "prometheus" and err.value.message == "prometheus exited with 1"
    assert err.value.log_tail == "error loading config: bad\nlast line"
    line = fleet_cli.fleet_failure("prefixfleet up", err.value)
    assert line.startswith("prefixfleet up: error: fleet process prometheus: prometheus exited with 1\n")


class FlakyPrometheus:
    """follow() fails while ``down`` (as a killed Prometheus refuses the reload), then succeeds."""

    url = "http://127.0.0.1:9090"

    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    async def follow(self) -> bool:
        self.calls += 1
        if self.down:
            raise httpx.ConnectError("All connection attempts failed")
        return True


async def test_a_dead_prometheus_is_said_once_and_its_return_once(capsys) -> None:
    # Before: the first scale-down after Prometheus died ended the fleet with httpx's traceback.
    local: Any = FlakyPrometheus()
    failing = False
    for _ in range(3):
        failing = await fleet_cli.follow_fleet(local, failing)
    assert failing
    local.down = False
    for _ in range(2):
        failing = await fleet_cli.follow_fleet(local, failing)
    assert not failing and local.calls == 5
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "prometheus http://127.0.0.1:9090 cannot follow the fleet (All connection attempts failed); the"
        " autoscaler reads the sidecars' /metrics for the replicas it does not scrape",
        "prometheus http://127.0.0.1:9090 follows the fleet again",
    ]
