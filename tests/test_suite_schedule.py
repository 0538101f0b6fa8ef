"""The suite's own scheduling: files holding a ``slow`` test are handed out first, so under
pytest-xdist (`make test`) the long end-to-end files start at once rather than last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collected_files(*files: str) -> list[str]:
    """The test files in the order pytest would run their items, for the files given in this order."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    order: list[str] = []
    for line in out.splitlines():
        if "::" in line:
            path = line.split("::", 1)[0]
            if not order or order[-1] != path:
                order.append(path)
    return order


def test_a_slow_file_named_last_runs_first() -> None:
    # test_addresses_cli.py has no slow test; test_sim_autoscale.py is marked slow.
    assert collected_files("tests/test_addresses_cli.py", "tests/test_sim_autoscale.py") == [
        "tests/test_sim_autoscale.py",
        "tests/test_addresses_cli.py",
    ]


def test_files_without_slow_tests_keep_their_order() -> None:
    assert collected_files("tests/test_worker_ports.py", "tests/test_addresses_cli.py") == [
        "tests/test_worker_ports.py",
        "tests/test_addresses_cli.py",
    ]


def test_the_make_target_keeps_that_order() -> None:
    # xdist's default re-sorts files by test count, which puts the few-test end-to-end files last.
    recipe = (ROOT / "Makefile").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in recipe
