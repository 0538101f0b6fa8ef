"""``prefixfleet chaos``: a fleet process that fails is one line naming it (as ``up`` says it), and a
--time-scale the emulator would refuse is refused before anything starts.

Before, ``chaos soak --time-scale 1e9`` passed the chaos checks, started Valkey, and died with a
``ChildFailedError`` traceback once engine-0 refused the speed-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.chaos import scenarios
from prefixfleet.cli import main
from prefixfleet.fleet.processes import ChildFailedError, claim_run_dir


def test_a_time_scale_the_emulator_refuses_is_refused_by_chaos_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert main(["chaos", "soak", "--time-scale", "1e9", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixfleet chaos soak: error: --time-scale must be between 0.001 and 1e+06"), err
    assert not run_dir.exists() or not any(run_dir.iterdir()), "something was started"


def test_a_fleet_process_that_fails_is_one_line_naming_it_and_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "engine-0.log"

    async def failing_soak(*_args: object, **_kwargs: object) -> dict:
        raise ChildFailedError("engine-0", "exited with status 2 before it was ready", "bad flag", log)

    monkeypatch.setattr(scenarios, "soak", failing_soak)
    with pytest.raises(SystemExit) as exited:
        main(["chaos", "soak", "--duration", "1", "--run-dir", str(tmp_path / "run")])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if "error:" in x)
    cause = "exited with status 2 before it was ready"
    assert line == f"prefixfleet chaos soak: error: fleet process engine-0: {cause} (log: {log})", err
    assert err.rstrip().endswith("bad flag"), err


def test_a_run_dir_another_run_holds_is_refused_before_a_fleet_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two fleets in one --run-dir append to the same <name>.log files: redis-outage counts the
    # gateways' "redis unavailable" lines there, so the other run's lines would be counted too.
    async def no_fleet(*_args: object, **_kwargs: object) -> dict:
        raise AssertionError("a fleet was started in a run directory another run holds")

    monkeypatch.setattr(scenarios, "soak", no_fleet)
    run_dir = tmp_path / "run"
    with claim_run_dir(run_dir):  # as a run in progress holds it
        status = main(["chaos", "soak", "--duration", "1", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert status == 2 and "is in use by another run" in err and "own --run-dir" in err, err
