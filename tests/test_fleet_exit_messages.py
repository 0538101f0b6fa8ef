"""How the local fleet words a child a signal ended, and `load` stopped by SIGTERM.

A child killed by SIGKILL read "exited unexpectedly with status -9": a negative exit code, not the
signal that ended it. And `prefixfleet load`, stopped by SIGTERM, said "every process it started
was stopped" though load starts no process (it sends requests to --target).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.fleet import processes
from prefixfleet.fleet.processes import ChildFailedError, Supervisor


async def _never_ready() -> bool:
    return False


async def _ready() -> bool:
    return True


async def test_a_child_killed_before_it_was_ready_names_the_signal(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as supervisor:
        with pytest.raises(ChildFailedError) as failed:
            await supervisor.start("engine", ["sh", "-c", "kill -KILL $$"], ready=_never_ready)
    assert failed.value.message == "exited with status -9 (SIGKILL) before it was ready"


async def test_a_child_killed_after_it_was_ready_names_the_signal(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as supervisor:
        child = await supervisor.start("engine", ["sleep", "600"], ready=_ready)
        os.killpg(child.pid, signal.SIGKILL)
        await child.process.wait()
        with pytest.raises(ChildFailedError) as failed:
            supervisor.check_alive()
    assert failed.value.message == "exited unexpectedly with status -9 (SIGKILL)"


async def test_a_child_exit_code_stays_a_plain_number(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as supervisor:
        with pytest.raises(ChildFailedError) as failed:
            await supervisor.start("engine", ["sh", "-c", "exit 3"], ready=_never_ready)
    assert failed.value.message == "exited with status 3 before it was ready"


def test_load_stopped_by_sigterm_does_not_claim_to_have_stopped_processes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def cancelled(main_: object) -> None:  # what run_until_signalled raises once SIGTERM cancelled the run
        raise asyncio.CancelledError

    monkeypatch.setattr(processes, "run_until_signalled", cancelled)
    with pytest.raises(SystemExit) as exit_:
        main(["load", "--target", "http://127.0.0.1:9", "--workload", "lab-burst", "--limit", "2"])
    assert exit_.value.code == 143
    assert capsys.readouterr().err == "prefixfleet load: stopped by SIGTERM\n"
