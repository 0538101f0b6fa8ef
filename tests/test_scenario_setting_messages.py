"""A refused ``--set`` names what the user typed: the scenario (not "workload") and the setting.

`prefixfleet sim-autoscale --scenario viral --set bogus=1` said "workload 'viral' has no setting
'bogus'", and a trace scenario "workload 'trace'" (neither is what was typed: a scenario,
``trace:PATH``). Some settings never reached a message at all: ``--set seed=3`` (every command) and
``--set requests=5`` / ``spec=x`` (up, compare, load) collided with the builders' own arguments, and
``--set path=x`` with a trace's, each a TypeError traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.scenarios import build_scenario

SCALE = ["sim-autoscale", "--scalers", "uniform", "--no-progress"]
SIM = ["sim", "--policies", "round_robin", "--no-progress"]
TRACE_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'


@pytest.fixture
def trace(tmp_path: Path) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE_LINE)
    return str(path)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--scenario", "viral", "--set", "bogus=1"],
            "scenario 'viral' has no setting 'bogus'; settings: duration_s, fade_s, hold_s, output_tokens, "
            "prefix_tokens_max, prefix_tokens_min, ramp_s, rate_rps, surge, tenants, unique_tokens_max, "
            "unique_tokens_min, viral_prefix_tokens, viral_share, viral_start_s, zipf_exponent",
        ),
        (
            ["--scenario", "viral", "--set", "tenants=0"],
            "scenario 'viral' setting 'tenants' must be positive, got '0'",
        ),
        (
            ["--scenario", "viral", "--set", "duration_s=abc"],
            "scenario 'viral' setting 'duration_s' must be a finite number, got 'abc'",
        ),
        (
            ["--scenario", "diurnal", "--set", "duration_s=-5"],
            "scenario 'diurnal' setting 'duration_s' must be positive, got '-5'",
        ),
        (
            ["--scenario", "viral", "--set", "tenants=1e9"],
            "scenario 'viral' setting 'tenants' is too large, got '1e9'; at most 10,000 tenants",
        ),
        (
            ["--scenario", "viral", "--set", "tenants=5000", "--set", "prefix_tokens_max=1e5"],
            "scenario 'viral': 'tenants' × 'prefix_tokens_max' would build 500,000,000 prefix tokens; "
            "at most 100,000,000",
        ),
        (
            ["--scenario", "viral", "--set", "zipf_exponent=1e6"],
            "scenario 'viral' setting 'zipf_exponent' '1e6' is too far from 0 for 48 ranks "
            "(weights overflow)",
        ),
        (
            ["--scenario", "diurnal", "--set", "peak_rps=1"],
            "scenario 'diurnal' setting 'peak_rps' ('1') must be >= 'trough_rps' (6.0)",
        ),
        (
            # a traceback before (OverflowError: the rotation drift × tenants as an int)
            ["--scenario", "diurnal", "--set", "drift=1e308"],
            "scenario 'diurnal' setting 'drift' ('1e308') is too large for 48 tenants over 1500 s "
            "(the ranking's rotation overflows a float)",
        ),
        (
            # drift × tenants finite, drift × tenants × t not (t > 4 s): still an OverflowError
            # traceback after 38026ac, which checked drift × tenants only
            ["--scenario", "diurnal", "--set", "drift=1e306"],
            "scenario 'diurnal' setting 'drift' ('1e306') is too large for 48 tenants over 1500 s "
            "(the ranking's rotation overflows a float)",
        ),
        (
            ["--scenario", "viral", "--set", "seed=3"],
            "--set seed=3: the seed is no scenario setting; use --seed",
        ),
    ],
)
def test_a_scenario_setting_is_refused_as_the_scenarios(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SCALE, *argv]) == 2
    assert capsys.readouterr().err == f"prefixfleet sim-autoscale: error: {line}\n"


def test_a_drift_the_rotation_can_hold_over_the_day_still_builds() -> None:
    # the check is on drift × tenants × duration: the same drift over a short enough day is fine
    workload = build_scenario("diurnal", drift="1e306", duration_s="2")
    assert workload.requests and max(r.arrival_s for r in workload.requests) < 2


@pytest.mark.parametrize(
    ("command", "setting", "line"),
    [
        (
            [*SCALE, "--scenario"],
            "speedup=0",
            "scenario '{spec}' setting 'speedup' must be positive, got '0'",
        ),
        (
            [*SCALE, "--scenario"],
            "bogus=1",
            "scenario '{spec}' has no setting 'bogus'; settings: block_tokens, limit, speedup, "
            "trace_block_tokens",
        ),
        (
            [*SCALE, "--scenario"],
            "path=x",
            "scenario '{spec}' takes its path from its name (trace:PATH), not from a setting 'path'",
        ),
        (
            [*SIM, "--workload"],
            "path=x",
            "workload '{spec}' takes its path from its name (trace:PATH), not from a setting 'path'",
        ),
        ([*SIM, "--workload"], "limit=-1", "workload '{spec}' setting 'limit' must be >= 0, got '-1'"),
    ],
)
def test_a_trace_setting_is_refused_under_the_name_typed(
    command: list[str], setting: str, line: str, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"trace:{trace}"
    assert main([*command, spec, "--set", setting]) == 2
    assert capsys.readouterr().err == f"prefixfleet {command[0]}: error: {line.format(spec=spec)}\n"


LOAD = ["load", "--target", "http://127.0.0.1:9", "--workload", "chat", "--no-progress"]
COMPARE = ["compare", "--json", "out.json", "--workload", "gsp", "--no-progress"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [*SIM, "--workload", "gsp", "--set", "seed=1"],
            "--set seed=1: the seed is no workload setting; use --seed",
        ),
        (["up", "--set", "seed=3"], "--set seed=3: the seed is no workload setting; use --seed"),
        ([*LOAD, "--set", "seed=2"], "--set seed=2: the seed is no workload setting; use --seed"),
        ([*COMPARE, "--set", "seed=4"], "--set seed=4: the seed is no workload setting; use --seed"),
        (["up", "--set", "requests=5"], "workload 'prefixroute' has no setting 'requests'; settings: "),
        (["up", "--set", "spec=x"], "workload 'prefixroute' has no setting 'spec'; settings: "),
        ([*LOAD, "--set", "requests=1"], "workload 'chat' has no setting 'requests'; settings: "),
        ([*COMPARE, "--set", "spec=x"], "workload 'gsp' has no setting 'spec'; settings: "),
    ],
)
def test_a_setting_named_like_an_argument_is_one_line(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # (nothing may be written; if it were, not into the checkout)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prefixfleet {argv[0]}: error: {line}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
