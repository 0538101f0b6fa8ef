"""`prefixfleet report` names the one duration flag that is wrong.

A bad --rate-window was reported as '--since/--rate-window: ...', leaving the user to guess which
of the two they got wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--since", "bogus"], "--since: not a duration like 15m, 1h or 90s: 'bogus'"),
        (["--rate-window", "bogus"], "--rate-window: not a duration like 15m, 1h or 90s: 'bogus'"),
        (["--rate-window", "0s"], "--rate-window: duration must be positive: '0s'"),
    ],
)
def test_a_bad_duration_names_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    argv = ["report", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path / "r"), *flags]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"prefixfleet report: error: {line}\n"
