"""`make test` (what CI runs) runs the suite on pytest-xdist workers, a file to a worker, while
`.venv/bin/pytest tests/test_x.py` stays one serial process: the serial suite took 19-23 min on the
2-core machine, and `-n` in pyproject's addopts would spawn workers for every single-file run too."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_runs_pytest_on_workers_a_file_to_a_worker() -> None:
    shown = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True)
    (pytest_line,) = [line for line in shown.stdout.splitlines() if re.search(r"\bpytest\b", line)]
    workers = re.search(r" -n (\d+)\b", pytest_line)
    assert workers and int(workers.group(1)) >= 2, pytest_line
    assert "--dist loadfile" in pytest_line
    chosen = subprocess.run(
        ["make", "-n", "test", "TEST_WORKERS=5"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert " -n 5 " in chosen


def test_the_test_extras_install_xdist_and_addopts_leave_a_single_file_serial() -> None:
    project = pyproject()
    extras = project["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"pytest-xdist\b", requirement) for requirement in extras), extras
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert not any(opt == "-n" or opt.startswith(("-n", "--numprocesses")) for opt in addopts), addopts
