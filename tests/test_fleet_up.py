"""`prefixfleet up` end to end at a tiny size: real Valkey, emulators, sidecars and two gateways."""

from __future__ import annotations

import json
import os
from pathlib import Path

from prefixfleet.cli import main

ROW_KEYS = {"mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "hit_rate", "errors"}


def live_children() -> list[str]:
    """Command lines of our live (non-zombie) child processes."""
    out = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out.append(cmd)
    return out


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
    assert out_png.stat().st_size > 0
    printed = capsys.readouterr().out
    assert "queue_aware*" in printed and "round_robin" in printed
    # every process it started is gone; each left its log behind
    assert live_children() == []
    logs = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert {"redis.log", "engine-0.log", "engine-1.log", "sidecar-0.log", "sidecar-1.log"} <= set(logs)
    assert "gateway-1-round_robin.log" in logs
