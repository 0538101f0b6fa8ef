"""A count setting given as a non-whole number is refused as that, and 1e3 is a count.

`--set num_requests=2.5` was refused with "must be a finite number, got '2.5'" (2.5 is finite) and
`--set num_requests=1e9` the same (a finite, whole number, too many requests), so the message named
the wrong rule. Count settings now take a whole number however it is written (1e3, 100.0) and say
"must be a whole number" otherwise; the request cap then names the real limit.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.workloads import build_workload

SIM = ["sim", "--workload", "prefixroute", "--policies", "round_robin", "--no-progress"]
SCALE = ["sim-autoscale", "--scenario", "viral", "--scalers", "uniform", "--no-progress"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [*SIM, "--set", "num_requests=2.5"],
            "prefixfleet sim: error: workload 'prefixroute' setting 'num_requests' must be a whole number, "
            "got '2.5'",
        ),
        (
            [*SCALE, "--set", "tenants=3.7"],
            "prefixfleet sim-autoscale: error: scenario 'viral' setting 'tenants' must be a whole number, "
            "got '3.7'",
        ),
        (
            [*SIM, "--set", "num_requests=1e9"],
            "prefixfleet sim: error: workload 'prefixroute': 'num_requests' would make about 1e+09 requests; "
            "at most 10,000,000",
        ),
    ],
)
def test_a_count_setting_names_the_rule_it_breaks(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("written", ["1e2", "100.0", " 100", "100"])
def test_a_whole_number_is_a_count_however_it_is_written(written: str) -> None:
    assert len(build_workload("prefixroute", num_requests=written).requests) == 100


def test_a_float_setting_still_names_finiteness(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--set", "rate_rps=inf"]) == 2
    assert "setting 'rate_rps' must be a finite number, got 'inf'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("2.5", "prefixfleet sim: error: --engine max_running must be a whole number, got '2.5'"),
        ("abc", "prefixfleet sim: error: --engine max_running must be a whole number, got 'abc'"),
        ("0", "prefixfleet sim: error: --engine max_running must be positive, got '0'"),
    ],
)
def test_an_engine_count_names_the_rule_it_breaks(
    value: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "--workload", "chat", "--set", "sessions=3", "--service", "batched", "--no-progress"]
    assert main([*argv, "--policies", "round_robin", "--engine", f"max_running={value}"]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_an_engine_count_takes_a_whole_number_however_written(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--workload", "chat", "--set", "sessions=3", "--service", "batched", "--no-progress"]
    assert main([*argv, "--policies", "round_robin", "--engine", "step_token_budget=4e3"]) == 0
