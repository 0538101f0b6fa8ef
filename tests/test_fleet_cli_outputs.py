"""`up` and `compare` refuse, before starting anything, outputs that would overwrite each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import UsageError, main
from prefixfleet.outputs import distinct_outputs

FAST = ["--requests", "10", "--replicas", "1", "--gateways", "1", "--no-sim-check", "--no-progress"]


@pytest.mark.parametrize("command", [["up", *FAST], ["compare", "--requests", "10", "--replicas", "1"]])
def test_json_and_plot_on_one_file_are_refused_before_the_run(command, tmp_path: Path, capsys) -> None:
    # Before: the run went through, then the plot was written over the JSON results (exit 0).
    same = tmp_path / "out" / "x.png"
    argv = [*command, "--json", str(same), "--plot", str(tmp_path / "out" / ".." / "out" / "x.png")]
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prefixfleet {command[0]}: error: --json and --plot both name ")
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()  # refused before any process started


@pytest.mark.parametrize("json_name", ["run", "."])
def test_a_json_at_or_above_the_run_dir_is_refused_before_the_run(json_name, tmp_path: Path, capsys) -> None:
    # Before: the run made the directory, then failed to write the JSON there after all of it (exit 2).
    out = tmp_path / "out"
    argv = ["up", *FAST, "--run-dir", str(out / "run"), "--json", str(out / json_name)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixfleet up: error: ") and "--json" in err and "--run-dir" in err, err
    assert not (out / "run").exists()


def test_distinct_outputs_accepts_different_paths_and_ignores_flags_not_given(tmp_path: Path) -> None:
    distinct_outputs(
        {"--json": tmp_path / "a.json", "--plot": tmp_path / "a.png", "--out": None},
        {"--run-dir": tmp_path / "run"},
    )
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "a.json")
    with pytest.raises(UsageError, match="--json and --plot both name"):
        distinct_outputs({"--json": tmp_path / "a.json", "--plot": link}, {})
