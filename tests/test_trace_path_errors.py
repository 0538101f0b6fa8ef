"""A trace path that cannot be read says why: "file not found" covered a directory, a device and an
unreadable file alike, and a read that failed part-way was a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main

TRACE_COMMANDS = [
    ["sim", "--workload"],
    ["sim-autoscale", "--scenario"],
    ["up", "--workload"],
    ["load", "--target", "http://127.0.0.1:9", "--workload"],
]


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("command", TRACE_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("{tmp}", "is a directory, not a trace file"),
        ("/dev/null", "is not a regular file"),
        (f"{__file__}/x", "a part of the path is not a directory"),
        ("/proc/self/mem", "cannot read: Input/output error"),  # a regular file whose read fails
        ("{tmp}/missing.jsonl", None),
    ],
)
def test_a_trace_that_cannot_be_read_names_the_reason(
    command: list[str], path: str, problem: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = path.format(tmp=tmp_path)
    line = _refusal([*command, f"trace:{path}"], capsys)
    said = f"trace file not found: {path}" if problem is None else f"trace {path}: {problem}"
    assert line.endswith(f": error: {said}"), line


def test_compare_trace_flag_names_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refusal(["compare", "--json", str(tmp_path / "c.json"), "--trace", str(tmp_path)], capsys)
    assert line == f"prefixfleet compare: error: --trace {tmp_path}: is a directory, not a trace file"
