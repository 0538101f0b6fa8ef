"""Two `prefixfleet up` (or `compare`) runs in one --run-dir at the same time: the second is refused in
one line before it starts anything. Before, both appended to the same <name>.log files, so each
fleet's logs, and the log tail an error shows, mixed in the other fleet's lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_fixtures import wait_until

from prefixfleet.cli import main
from prefixfleet.fleet.processes import RunDirInUse, claim_run_dir

FAST = ["--requests", "10", "--replicas", "1", "--gateways", "1", "--no-progress"]


@pytest.mark.parametrize("command", [["up", *FAST, "--no-sim-check"], ["compare", *FAST[:4]]])
def test_a_second_run_in_a_run_dir_in_use_is_refused(command, tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    with claim_run_dir(run_dir):  # as another `up` holds it for its whole run
        argv = [*command, "--json", str(tmp_path / "x.json"), "--run-dir", str(run_dir)]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"prefixfleet {command[0]}: error: --run-dir {run_dir} is in use by another run (pid {os.getpid()});"
        " give this run its own --run-dir\n"
    )
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # no process was started, no log written


def test_a_run_dir_is_free_again_once_its_holder_is_gone_however_it_ended(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time; from pathlib import Path\n"
            "from prefixfleet.fleet.processes import claim_run_dir\n"
            "with claim_run_dir(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(300)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirInUse) as err, claim_run_dir(run_dir):
            pass
        assert err.value.holder == str(holder.pid)
        holder.send_signal(signal.SIGKILL)  # no clean-up of its own: the kernel drops its lock
        holder.wait()
        wait_until(lambda: _claimable(run_dir), 30, "the dead holder's lock to go")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def _claimable(run_dir: Path) -> bool:
    try:
        with claim_run_dir(run_dir):
            return True
    except RunDirInUse:
        return False
