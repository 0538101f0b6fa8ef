"""``python -m prefixfleet.observability.scenario`` (the docs' pictures): refusals come first, in one line.

Without a ``prometheus`` binary the scenario used to start the whole fleet (about 20 s on a shared
machine) and then die with a ``PrometheusNotFound`` traceback; a zero ``--rate`` died with a
ZeroDivisionError traceback. Both are now one line naming the fix, before any process starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.observability import scenario


class _NoFleet:
    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise AssertionError("a fleet was started although the run cannot go ahead")


@pytest.fixture
def no_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scenario, "Supervisor", _NoFleet)


@pytest.mark.usefixtures("no_fleet")
def test_without_prometheus_the_scenario_says_how_to_install_it_before_starting_a_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no prometheus on PATH
    status = scenario.main(["--out", str(tmp_path / "img")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "prometheus is not on PATH" in err and "apt-get install -y prometheus" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.usefixtures("no_fleet")
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rate", "0"], "--rate must be a positive number"),
        (["--rate", "nan"], "--rate must be a positive number"),
        (["--requests", "0"], "--requests must be at least 1"),
        (["--time-scale", "-1"], "--time-scale must be a positive number"),
        (["--hold", "-2"], "--hold must be a positive number"),
    ],
)
def test_bad_scenario_flags_are_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        scenario.main(["--out", str(tmp_path / "img"), *flags])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err, err
