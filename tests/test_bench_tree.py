"""`prefixfleet bench tree` at a tiny size: report shape and sanity, never timing thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixfleet.benchmarks.lab_tree import LabCacheFull, LabTree
from prefixfleet.benchmarks.tree import TreeBenchSettings, format_table, run_tree_benchmark
from prefixfleet.cli import main

SIDE_KEYS = {
    "ops",
    "ops_per_s",
    "p50_us",
    "p99_us",
    "bytes_per_node",
    "bytes_per_token",
    "overhead_bytes_per_node",
    "nodes",
    "cached_tokens",
}
TINY = TreeBenchSettings(min_nodes=40, prompt_tokens=64, ops=20, lab_ops=5, seed=3)


def test_report_has_both_sides_with_positive_numbers() -> None:
    report = run_tree_benchmark(TINY, progress=False)
    assert {"ours", "lab", "speedup"} <= set(report)
    for side in ("ours", "lab"):
        numbers = report[side]
        assert set(numbers) >= SIDE_KEYS
        for key in SIDE_KEYS - {"overhead_bytes_per_node"}:
            assert numbers[key] > 0, (side, key)
        assert numbers["p99_us"] >= numbers["p50_us"]
        assert numbers["nodes"] >= TINY.min_nodes
    assert report["ours"]["ops"] == TINY.ops and report["lab"]["ops"] == TINY.lab_ops
    # both trees were built from the same prompts and must hold the same thing
    assert report["ours"]["nodes"] == report["lab"]["nodes"]
    assert report["ours"]["cached_tokens"] == report["lab"]["cached_tokens"]
    assert report["speedup"] > 0
    assert report["settings"]["capacity_tokens"] == report["ours"]["cached_tokens"]
    assert "ours" in format_table(report) and "speedup" in format_table(report)


def test_cli_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tree.json"
    argv = ["bench", "tree", "--quiet", "--json", str(out), "--min-nodes", "30", "--prompt-tokens", "32"]
    assert main([*argv, "--ops", "10", "--lab-ops", "3"]) == 0
    report = json.loads(out.read_text())
    assert report["ours"]["ops"] == 10 and report["lab"]["ops"] == 3
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ops", "0"], "ops must be a positive integer"),
        (["--ops", "5", "--lab-ops", "6"], "lab_ops"),
        (["--json", f"{__file__}/x.json"], "is not a directory"),  # under a regular file
    ],
)
def test_bad_settings_are_a_one_line_usage_error(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "tree", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_lab_baseline_behaves_like_the_seed_lab() -> None:
    lab = LabTree(10)
    lab.insert((1, 2, 3, 4, 5, 6))
    assert lab.insert((1, 2, 3, 4, 9, 10)) == (4, 2)
    assert lab.cached_tokens == 8 and lab.node_count() == 3
    assert lab.match_prefix((1, 2, 3, 4, 5))[0] == 5
    lab.insert((7, 7, 7, 7))  # evicts the least recently used leaf, [9, 10]
    assert lab.match_prefix((1, 2, 3, 4, 9, 10))[0] == 4
    lab.insert((8, 8), pin=True)
    lab.insert((1, 2, 3, 4, 5, 6), pin=True)
    with pytest.raises(LabCacheFull):
        lab.insert((5, 5, 5, 5, 5, 5))  # all that is left unpinned cannot make room
    assert lab.match_prefix((1, 2, 3, 4, 5, 6))[0] == 6 and lab.cached_tokens <= 10
