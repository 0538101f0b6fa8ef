"""A count setting too large for a float says so, not "must be a whole number".

`--set num_requests=1e400` (and `--engine max_running=1e400`) was refused with "must be a whole
number, got '1e400'": 1e400 is a whole number as written, only too large (it reads as infinity).
The one line now says the value is too large and, where the setting has a cap, what the cap is;
-1e400 breaks the setting's lower bound and says that; 'nan' is still no whole number.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.workloads import MAX_PREFIXES, MAX_SETTING_TOKENS, MAX_WORKLOAD_REQUESTS

SIM = ["sim", "--workload", "prefixroute", "--policies", "round_robin", "--no-progress"]
SCALE = ["sim-autoscale", "--scenario", "viral", "--scalers", "uniform", "--no-progress"]
SETTING = "prefixfleet sim: error: workload 'prefixroute' setting"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [*SIM, "--set", "num_requests=1e400"],
            f"{SETTING} 'num_requests' is too large, got '1e400'; at most {MAX_WORKLOAD_REQUESTS:,} requests",
        ),
        (
            [*SIM, "--set", "prefix_tokens_max=1e400"],
            f"{SETTING} 'prefix_tokens_max' is too large, got '1e400'; at most {MAX_SETTING_TOKENS:,} tokens",
        ),
        (
            [*SCALE, "--set", "tenants=1e400"],
            "prefixfleet sim-autoscale: error: scenario 'viral' setting 'tenants' is too large, got '1e400'; "
            f"at most {MAX_PREFIXES:,} tenants",
        ),
        ([*SIM, "--set", "num_requests=-1e400"], f"{SETTING} 'num_requests' must be positive, got '-1e400'"),
        ([*SIM, "--set", "num_requests=nan"], f"{SETTING} 'num_requests' must be a whole number, got 'nan'"),
        (
            # a finite count past the cap keeps naming the cap it breaks
            [*SIM, "--set", "num_requests=1e20"],
            "prefixfleet sim: error: workload 'prefixroute': 'num_requests' would make about 1e+20 requests; "
            f"at most {MAX_WORKLOAD_REQUESTS:,}",
        ),
    ],
)
def test_a_count_setting_out_of_range_says_so(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


ENGINE = ["sim", "--workload", "chat", "--set", "sessions=3", "--service", "batched", "--no-progress"]


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("1e400", "--engine max_running is too large, got '1e400' (beyond what a float holds)"),
        ("-1e400", "--engine max_running must be positive, got '-1e400'"),
        ("nan", "--engine max_running must be a whole number, got 'nan'"),
    ],
)
def test_an_engine_count_out_of_range_says_so(
    value: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*ENGINE, "--policies", "round_robin", "--engine", f"max_running={value}"]) == 2
    assert capsys.readouterr().err == f"prefixfleet sim: error: {line}\n"
