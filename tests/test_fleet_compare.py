"""`prefixfleet compare` at a tiny size: our gateway (two policies) and the real sglang-router."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from prefixfleet.cli import main

pytestmark = pytest.mark.slow

ROUTER_KEYS = {"mean_ttft_ms", "p99_ttft_ms", "hit_rate", "errors"}


def write_tiny_trace(path: Path) -> None:
    """Mooncake format: 8 conversations of 3 turns (each turn extends the last), 0.1 s apart."""
    lines = []
    for turn in range(3):
        for conv in range(8):
            ids = [1000 * conv + k for k in range(turn + 2)]  # chained: turn t shares t+1 blocks
            t_ms = (turn * 8 + conv) * 100
            lines.append(
                json.dumps(
                    {"timestamp": t_ms, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids}
                )
            )
    path.write_text("\n".join(lines) + "\n")


def test_compare_produces_the_three_router_rows_and_added_latency(tmp_path: Path) -> None:
    trace, out = tmp_path / "trace.jsonl", tmp_path / "compare.json"
    write_tiny_trace(trace)
    status = main(
        [
            "compare",
            "--trace", str(trace),
            "--requests", "24",
            "--replicas", "2",
            "--time-scale", "8",
            "--latency-rate", "20",
            "--latency-seconds", "0.5",
            "--json", str(out),
            "--plot", str(tmp_path / "compare.png"),
            "--run-dir", str(tmp_path / "run"),
            "--no-progress",
        ]
    )  # fmt: skip
    assert status == 0
    report = json.loads(out.read_text())
    assert report["workload"] == f"trace:{trace}"
    assert set(report["added_latency_ms"]) == {"p50", "p99"}
    routers = report["routers"]
    assert set(routers) == {"prefixfleet", "round_robin", "sglang_cache_aware"}
    measured = ["prefixfleet", "round_robin"]
    if importlib.util.find_spec("sglang_router") is None:
        assert "not installed" in routers["sglang_cache_aware"]["skipped"]
    else:
        measured.append("sglang_cache_aware")
    for name in measured:
        assert set(routers[name]) == ROUTER_KEYS
        assert routers[name]["errors"] == 0
        # turns 2 and 3 of each conversation repeat the previous turn: the engines report hits
        assert 0.0 < routers[name]["hit_rate"] < 1.0
    assert report["details"]["added_latency"]["gateway_errors"] == 0
    assert (tmp_path / "compare.png").stat().st_size > 0
