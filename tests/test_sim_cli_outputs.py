"""`sim` and `sim-autoscale` refuse, before simulating, a --json and --plot that name one file.

Before, `sim --workload chat --json x.png --plot x.png` simulated every policy (about 20 s), exited 0,
and the plot was written over the JSON results; `sim-autoscale` the same. The simulators are
replaced here by a function that fails the test, so a run that gets past the flags is seen at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.sim import autoscale_cli
from prefixfleet.sim import cli as sim_cli


def _no_run(*_args: object, **_kwargs: object) -> None:
    pytest.fail("the simulation started although the outputs collide")


@pytest.fixture(autouse=True)
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_cli, "simulate", _no_run)
    monkeypatch.setattr(autoscale_cli, "simulate_elastic", _no_run)


COMMANDS = {
    "sim": ["sim", "--workload", "chat", "--no-progress"],
    "sim-autoscale": ["sim-autoscale", "--scenario", "viral", "--scalers", "uniform", "--no-progress"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_json_and_plot_on_one_file_are_refused_before_the_run(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = tmp_path / "out" / "x.png"
    argv = [*command, "--json", str(same), "--plot", str(tmp_path / "out" / ".." / "out" / "x.png")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    named = f"--json and --plot both name {tmp_path}/out/../out/x.png"
    assert err == f"prefixfleet {command[0]}: error: {named}; give each its own path\n"
    assert not same.exists()


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_plot_through_a_symlink_to_the_json_is_refused(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "r.png").symlink_to(tmp_path / "r.json")
    assert main([*command, "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]) == 2
    assert "--json and --plot both name" in capsys.readouterr().err
    assert (tmp_path / "r.json").read_text() == "{}"
