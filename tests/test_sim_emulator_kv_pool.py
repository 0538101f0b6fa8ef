"""`prefixfleet sim` and `sim-autoscale` with `--service emulator` and a cache smaller than a request.

An emulated engine refuses a request whose prompt + output tokens exceed its KV pool, and so does the
simulated one (`EmulatedReplica.accept`). Both commands ran until they reached the first such request
and ended in a ValueError traceback (`sim --workload viral --service emulator --cache-tokens 3000`
got to request #509 first). Now the run is refused before it starts, in one line, exit 2; a cache
that holds the largest request exactly still runs.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.scenarios import build_scenario
from prefixfleet.sim.workloads import build_workload

SIM = ["sim", "--workload", "prefixroute", "--set", "num_requests=12", "--policies", "round_robin"]
SCENARIO = {"duration_s": 8, "rate_rps": 1, "tenants": 2, "viral_start_s": 2, "ramp_s": 2, "hold_s": 2}
AUTOSCALE = [
    "sim-autoscale", "--scenario", "viral", "--scalers", "uniform",
    *[f"--set={k}={v}" for k, v in SCENARIO.items()],
]  # fmt: skip


def largest_need(requests) -> int:
    return max(len(r.tokens) // 4 + max(1, r.output_tokens) for r in requests)


@pytest.mark.parametrize(
    ("argv", "requests"),
    [
        (SIM, build_workload("prefixroute", seed=0, num_requests=12).requests),
        (AUTOSCALE, build_scenario("viral", seed=0, **SCENARIO).requests),
    ],
    ids=["sim", "sim-autoscale"],
)
def test_a_cache_smaller_than_a_request_is_refused_before_the_run(argv, requests, capsys) -> None:
    need = largest_need(requests)
    emulated = [*argv, "--service", "emulator", "--no-progress"]
    assert main([*emulated, "--cache-tokens", str(need - 1)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err and captured.out == ""
    assert f"a {need - 1}-token cache (--cache-tokens) is too small for the emulator service model" in err
    assert f"needs {need} tokens" in err
    # the largest request fits exactly: the run goes ahead
    assert main([*emulated, "--cache-tokens", str(need)]) == 0
    assert capsys.readouterr().err == ""
