"""Ctrl-C and SIGTERM at the phases of `prefixfleet up` that run before the fleet exists: one line and
exit status 130, never a traceback, and no process left."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_fixtures import popen_interruptible, wait_until

import prefixfleet.cli as cli


def test_ctrl_c_while_the_command_module_imports_is_one_line(monkeypatch, capsys) -> None:
    # Building the parser imports the command's module: seconds on a busy machine (`prefixfleet up`
    # took 2.5 s there), long enough for a Ctrl-C, which printed the import's traceback.
    def interrupted(only: str | None = None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["up", "--requests", "10"]) == 130
    assert capsys.readouterr().err == "prefixfleet up: interrupted\n"
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "prefixfleet: interrupted\n"


@pytest.mark.parametrize("argv", [["--help"], ["no-such-command"]])
def test_ctrl_c_before_a_command_is_known_names_the_program_only(argv, monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "build_parser", lambda only=None: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert cli.main(argv) == 130
    assert capsys.readouterr().err == "prefixfleet: interrupted\n"


# Run with SIGINT ignored, as a background job of a non-interactive shell runs (`make test &`): the
# child prints how it found SIGINT when started by popen_interruptible and by a plain Popen.
_SIGINT_AS_FOUND = """
import signal, subprocess, sys
from fleet_fixtures import popen_interruptible

show = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"]
for start in (popen_interruptible, subprocess.Popen):
    with start(show, stdout=subprocess.PIPE, text=True) as child:
        print(child.communicate()[0].strip())
"""


def test_a_child_the_tests_interrupt_gets_sigint_even_when_the_run_ignores_it() -> None:
    # The keep-running and sim-check tests below and in test_fleet_up/test_cli_badinput_sweep timed
    # out in a `make test` started in the background: their `up` inherited SIGINT ignored.
    ignoring = subprocess.run(
        [sys.executable, "-c", _SIGINT_AS_FOUND],
        capture_output=True,
        text=True,
        timeout=60,  # bounds a hang only: two interpreter start-ups
        cwd=Path(__file__).parent,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert ignoring.returncode == 0, ignoring.stderr
    # ignored? no for popen_interruptible's child; yes for a plain Popen's (what the tests had)
    assert ignoring.stdout.split() == ["False", "True"]


# A stand-in for the sim check that says it started, then computes "for ever": a Ctrl-C must end it.
_SIM_BLOCKS = """
import sys, time
from pathlib import Path
import prefixfleet.fleet.local as local

def simulate_policies(*args, **kwargs):
    Path(sys.argv[1]).write_text("started")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # CPU-bound, no await: as the real simulator
        sum(range(10_000))
    raise SystemExit("the simulation was not interrupted")

local.simulate_policies = simulate_policies
from prefixfleet.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_ctrl_c_during_the_sim_check_stops_up_at_once(tmp_path: Path) -> None:
    # The sim check took 14 s of `up --policies all` on a busy machine, run inside the event loop:
    # a Ctrl-C only cancelled the task, which waited for the simulation to end, then for Valkey.
    marker = tmp_path / "sim-started"
    proc = popen_interruptible(
        [
            sys.executable, "-c", _SIM_BLOCKS, str(marker),
            "up", "--requests", "10", "--replicas", "1", "--gateways", "1", "--policies", "round_robin",
            "--no-progress", "--run-dir", str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, 120, "the sim check to start")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # before the fix: the fake simulation's 300 s
        assert proc.returncode == 130, err
        assert err == "prefixfleet up: interrupted\n"
        assert out == ""
        assert not (tmp_path / "run" / "redis.log").exists()  # nothing was started after the Ctrl-C
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
