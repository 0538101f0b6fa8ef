"""A refused simulator engine setting names the setting given, not a list of every setting.

`prefixfleet sim --engine prefill_pass_s=0.1` (fifo) used to answer with all nine emulator-only
parameter names, and `--engine max_running=0` with both bounded ones, leaving the user to find
which one they got wrong.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.engine import ServiceConfig

SIM = ["sim", "--workload", "prefixroute", "--set", "num_requests=5", "--policies", "round_robin"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--engine", "prefill_pass_s=0.1"],
            "prefill_pass_s applies to the emulator service model only (--service emulator), not fifo",
        ),
        (
            ["--service", "batched", "--engine", "share_sends=true", "--engine", "forward_delay_s=0.01"],
            "forward_delay_s, share_sends apply to the emulator service model only (--service emulator), "
            "not batched",
        ),
        (
            ["--service", "batched", "--engine", "max_running=0"],
            "--engine max_running must be positive, got '0'",
        ),
        (
            ["--service", "batched", "--engine", "step_token_budget=-3"],
            "--engine step_token_budget must be positive, got '-3'",
        ),
    ],
)
def test_the_line_names_the_settings_given(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SIM, *argv]) == 2
    assert capsys.readouterr().err == f"prefixfleet sim: error: {line}\n"


def test_the_emulator_model_still_takes_them() -> None:
    ServiceConfig("emulator", prefill_s_per_token=1e-4, prefill_pass_s=0.01, share_sends=True)
