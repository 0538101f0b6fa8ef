"""`prefixfleet up` end to end at a tiny size: real Valkey, emulators, sidecars and two gateways."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_fixtures import live_children, live_processes, popen_interruptible

from prefixfleet.cli import main

pytestmark = pytest.mark.slow

ROW_KEYS = {"mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "hit_rate", "errors"}


def test_up_runs_each_policy_through_two_gateways_and_stops_everything(tmp_path: Path, capsys) -> None:
    out_json, out_png = tmp_path / "up.json", tmp_path / "up.png"
    status = main(
        [
            "up",
            "--requests", "40",
            "--replicas", "2",
            "--gateways", "2",
            "--time-scale", "4",
            "--policies", "default,round_robin",
            "--json", str(out_json),
            "--plot", str(out_png),
            "--run-dir", str(tmp_path / "run"),
            "--no-progress",
        ]
    )  # fmt: skip
    assert status == 0
    report = json.loads(out_json.read_text())
    assert report["workload"] == "prefixroute"
    assert report["settings"]["replicas"] == 2 and report["settings"]["gateways"] == 2
    assert set(report["policies"]) == {"queue_aware", "round_robin"}
    for row in report["policies"].values():
        assert set(row) >= ROW_KEYS
        assert row["errors"] == 0 and row["requests"] == 40
        assert 0.0 < row["hit_rate"] <= 1.0  # tenants share prefixes: some tokens must hit
        assert 0 < row["p50_ttft_ms"] <= row["p99_ttft_ms"]
    agreement = report["sim"]["agreement"]
    assert sorted(agreement["live_order"]) == sorted(agreement["sim_order"]) == ["queue_aware", "round_robin"]
    resolved = report["sim"]["resolved_agreement"]
    pairs = resolved["confirmed_pairs"] + resolved["contradicting_pairs"] + resolved["unresolved_pairs"]
    assert pairs == [["queue_aware", "round_robin"]]
    assert resolved["agree"] == (not resolved["contradicting_pairs"])
    assert "ttft_ms_by_request" not in report["sim"]["policies"]["queue_aware"]  # kept out of the JSON
    assert out_png.stat().st_size > 0
    printed = capsys.readouterr().out
    assert "queue_aware*" in printed and "round_robin" in printed
    # every process it started is gone; each left its log behind
    left = live_children()
    assert left == [], [p.command_line() for p in left]
    logs = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert {"redis.log", "engine-0.log", "engine-1.log", "sidecar-0.log", "sidecar-1.log"} <= set(logs)
    assert "gateway-1-round_robin.log" in logs


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_keep_running_fleet_stops_everything_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    proc = popen_interruptible(
        [
            sys.executable, "-m", "prefixfleet.cli", "up",
            "--requests", "10", "--replicas", "1", "--gateways", "1", "--time-scale", "8",
            "--policies", "round_robin", "--no-sim-check", "--no-progress", "--keep-running",
            "--run-dir", str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for _ in range(200):  # bounded: the banner comes after the benchmark
            line = proc.stdout.readline()
            if not line or "fleet running" in line:
                break
        assert "fleet running" in line, proc.stderr.read() if proc.stderr else ""
        fleet = [p.pid for p in live_children(proc.pid)]
        assert len(fleet) >= 4  # redis, engine, sidecar, gateway
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert proc.returncode == (130 if sig == signal.SIGINT else 143)
        alive = {p.pid for p in live_processes()}
        assert [pid for pid in fleet if pid in alive] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
