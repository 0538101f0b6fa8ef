"""A ``--run-dir`` whose lock file cannot be opened is one error line, not a traceback.

``up``, ``compare`` and ``chaos`` hold their run directory with a lock file (``RUN_DIR_LOCK``). The
checks before the run ask whether the directory can be made and written; the lock file itself was
opened unguarded, so one that cannot be (left by ``sudo prefixfleet up`` in a directory the user
owns: root's file, permission denied; here a directory in its place, which fails the same way for
root too) ended the command with a traceback. Now it is ``error: --run-dir ...`` and exit 2, and an
error inside the run is still the run's (the guard covers taking the lock only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.fleet.cli import claimed
from prefixfleet.fleet.processes import RUN_DIR_LOCK

FAST = ["--requests", "10", "--replicas", "1", "--gateways", "1", "--no-progress"]


@pytest.mark.parametrize("command", [["up", *FAST, "--no-sim-check"], ["compare", *FAST[:4]]])
def test_a_lock_file_that_cannot_be_opened_is_an_error_line(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / RUN_DIR_LOCK).mkdir(parents=True)
    assert main([*command, "--json", str(tmp_path / "x.json"), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prefixfleet {command[0]}: error: --run-dir {run_dir}: cannot use it (")
    assert "Is a directory" in err and "Traceback" not in err


def test_an_os_error_inside_the_run_is_not_blamed_on_the_run_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), claimed(tmp_path / "run"):
        raise FileNotFoundError("the run's own")
