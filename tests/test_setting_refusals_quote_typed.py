"""A refused ``--set`` quotes the value as the user typed it, not as it was read.

`prefixfleet sim-autoscale --scenario viral --set rate_rps=0` said "got 0.0" and a trace's
``--set speedup=0`` "got 0.0"; '1e308' came back as "1e+308", '1e6' as "1e+06" and '1.50' as
"1.5": the positive-only, [0, 1], min <= max, peak >= trough, drift and Zipf refusals showed the
converted number while the other ``--set`` refusals (">= 0", "a whole number") quoted the text.
Every command that takes ``--set`` (sim, sim-autoscale, up, compare, load) says it the same way:
a quoted value is what was typed, an unquoted one the setting's own default.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.workloads import build_workload

SIM = ["sim", "--policies", "round_robin", "--no-progress", "--workload"]
SCALE = ["sim-autoscale", "--scalers", "uniform", "--no-progress", "--scenario"]
UP = ["up", "--workload"]
COMPARE = ["compare", "--json", "out.json", "--no-progress", "--workload"]
LOAD = ["load", "--target", "http://127.0.0.1:9", "--no-progress", "--workload"]
TRACE_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [*SCALE, "viral", "--set", "rate_rps=0"],
            "scenario 'viral' setting 'rate_rps' must be positive, got '0'",
        ),
        (
            [*SIM, "chat", "--set", "turns_min=0e0"],
            "workload 'chat' setting 'turns_min' must be positive, got '0e0'",
        ),
        (
            [*UP, "prefixroute", "--set", "rate_rps=0"],
            "workload 'prefixroute' setting 'rate_rps' must be positive, got '0'",
        ),
        (
            [*COMPARE, "gsp", "--set", "rate_rps=-0"],
            "workload 'gsp' setting 'rate_rps' must be positive, got '-0'",
        ),
        (
            [*LOAD, "chat", "--set", "sessions=0.0"],
            "workload 'chat' setting 'sessions' must be positive, got '0.0'",
        ),
        (
            [*SIM, "viral", "--set", "viral_share=1.50"],
            "workload 'viral' setting 'viral_share' must be in [0, 1], got '1.50'",
        ),
        (
            [*SCALE, "viral", "--set", "viral_share=2"],
            "scenario 'viral' setting 'viral_share' must be in [0, 1], got '2'",
        ),
        (
            [*LOAD, "prefixroute", "--set", "zipf_exponent=1e6"],
            "workload 'prefixroute' setting 'zipf_exponent' '1e6' is too far from 0 for 12 ranks "
            "(weights overflow)",
        ),
        (
            [*SIM, "prefixroute", "--set", "prefix_tokens_min=2e3"],
            "workload 'prefixroute' setting 'prefix_tokens_min' ('2e3') must be <= "
            "'prefix_tokens_max' (1000)",
        ),
        (
            [*SCALE, "diurnal", "--set", "peak_rps=1.0", "--set", "trough_rps=2e0"],
            "scenario 'diurnal' setting 'peak_rps' ('1.0') must be >= 'trough_rps' ('2e0')",
        ),
    ],
)
def test_a_refusal_quotes_the_setting_as_typed(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == f"prefixfleet {argv[0]}: error: {line}\n"


@pytest.mark.parametrize("command", [SIM, SCALE, UP, COMPARE, LOAD])
def test_a_trace_speedup_of_zero_is_quoted_as_typed(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE_LINE)
    kind = "scenario" if command is SCALE else "workload"
    assert main([*command, f"trace:{trace}", "--set", "speedup=0"]) == 2
    assert capsys.readouterr().err == (
        f"prefixfleet {command[0]}: error: {kind} 'trace:{trace}' setting 'speedup' "
        "must be positive, got '0'\n"
    )


def test_a_value_passed_from_python_is_quoted_as_passed() -> None:
    # the library call has no text: its refusal shows the value it was given (0.0, not '0.0')
    with pytest.raises(ValueError, match=r"^workload 'gsp' setting 'rate_rps' must be positive, got 0\.0$"):
        build_workload("gsp", rate_rps=0.0)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # ServiceConfig's own lines: "max_running must be positive, got 0" (of '0e0'), and a negative
        # duration "decode_base_s must be >= 0" without the value or the flag
        (["--engine", "max_running=0e0"], "--engine max_running must be positive, got '0e0'"),
        (["--engine", "step_token_budget=-1e0"], "--engine step_token_budget must be positive, got '-1e0'"),
        (["--engine", "decode_base_s=-1e0"], "--engine decode_base_s must be >= 0, got '-1e0'"),
        (["--engine", "prefill_pass_s=-0.50"], "--engine prefill_pass_s must be >= 0, got '-0.50'"),
    ],
)
@pytest.mark.parametrize("command", [[*SIM, "chat"], [*SCALE, "viral"]])
def test_an_engine_parameter_is_quoted_as_typed(
    command: list[str], argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--service", "batched", *argv]) == 2
    assert capsys.readouterr().err == f"prefixfleet {command[0]}: error: {line}\n"
