"""A workload whose prompts would not fit in memory is refused before any is built, with one line.

Within the request cap (10,000,000) and the per-setting token cap (10,000,000) a workload could still
hold hundreds of gigabytes: every request keeps its whole prompt as token bytes, a shared prefix
copied into each. `--set num_requests=1e7` (prefixroute's ~1,100-token prompts: 45 GB), chat's
prompts growing with every turn (`sessions=1 turns_max=1e7`), gsp's 10,000 × 1,000 prompts,
lab-burst's 1,016 requests of 10,000,000-token suffixes, viral's million-token turns, a trace
replayed at 20,000 tokens per hash id, and the scenarios over long days all ran until the machine
ran out. The prompt tokens a workload would make are now estimated from its settings and held to
:data:`MAX_WORKLOAD_TOKENS`.

The hang cases run the real CLI in a subprocess bounded in time and memory (tests/bounded_cli.py):
before the fix they never return.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from bounded_cli import run_cli

from prefixfleet.sim import scenarios, workloads
from prefixfleet.sim.workloads import MAX_WORKLOAD_TOKENS, build_workload

SIM = ["sim", "--policies", "round_robin", "--no-progress"]
SCALE = ["sim-autoscale", "--scalers", "uniform", "--no-progress"]
CAP = f"prompt tokens; at most {MAX_WORKLOAD_TOKENS:,}"
MOONCAKE = Path(__file__).resolve().parents[1] / "traces" / "mooncake_synthetic_trace.jsonl"

# (command line, the line it ends with); every case is within the request and per-setting caps
TOO_BIG = [
    (
        [*SIM, "--workload", "prefixroute", "--set", "num_requests=1e7"],
        "sim: error: workload 'prefixroute': 'num_requests' × the prompt sizes would make about "
        f"8.9e+09 {CAP}",
    ),
    (
        [*SIM, "--workload", "chat", "--set", "sessions=1", "--set", "turns_max=1e7"],
        "sim: error: workload 'chat': 'sessions' × the turns' growing prompts would make about "
        f"6.13e+15 {CAP}",
    ),
    (
        [*SIM, "--workload", "gsp", "--set", "groups=10000", "--set", "prompts_per_group=1000"],
        "sim: error: workload 'gsp': 'groups' × 'prompts_per_group' × the prompt sizes would make about "
        f"2.18e+10 {CAP}",
    ),
    (
        [*SIM, "--workload", "lab-burst", "--set", "suffix_tokens=1e7", "--set", "burst_requests=1000"],
        f"sim: error: workload 'lab-burst': the requests × the prompt sizes would make about 1.02e+10 {CAP}",
    ),
    (
        [*SIM, "--workload", "viral", "--set", "turn_tokens_min=1e6", "--set", "turn_tokens_max=1e6"],
        "sim: error: workload 'viral': 'rate_rps', 'surge', 'duration_s' × the prompt sizes would make "
        f"about 3.51e+09 {CAP}",
    ),
    (
        # 20,000 tokens per hash id instead of 512: the Mooncake trace's 61M tokens become 2.4e9
        [*SIM, "--workload", f"trace:{MOONCAKE}", "--set", "block_tokens=2e4"],
        f"sim: error: workload 'trace:{MOONCAKE}': the hash ids of 3,993 requests × 'block_tokens' "
        f"would make about 2.39e+09 {CAP}",
    ),
    (
        [*SCALE, "--scenario", "diurnal", "--set", "peak_rps=1000"],
        "sim-autoscale: error: scenario 'diurnal': the requests × the prompt sizes would make about "
        f"4.45e+09 {CAP}",
    ),
    (
        [*SCALE, "--scenario", "viral", "--set", "duration_s=1e5"],
        "sim-autoscale: error: scenario 'viral': the requests × the prompt sizes would make about "
        f"3.2e+10 {CAP}",
    ),
]


IDS = [" ".join(argv[4:]).replace(str(MOONCAKE), "mooncake") for argv, _ in TOO_BIG]


@pytest.mark.parametrize(("argv", "line"), TOO_BIG, ids=IDS)
def test_a_workload_too_big_for_memory_is_one_line_not_a_hang(argv: list[str], line: str) -> None:
    done = run_cli(argv)  # the bug: never returned (TimeoutExpired), or ran out of memory
    assert (done.returncode, done.stderr) == (2, f"prefixfleet {line}\n")


def test_the_budget_is_exact() -> None:
    # on the pure check, not a build: anything over the budget is gigabytes if the check regresses
    workloads.check_prompt_tokens("lab-burst", MAX_WORKLOAD_TOKENS, "the requests × the prompt sizes")
    with pytest.raises(ValueError, match=r"would make about 2e\+09 prompt tokens; at most 2,000,000,000"):
        workloads.check_prompt_tokens("lab-burst", MAX_WORKLOAD_TOKENS + 1, "the requests × the prompt sizes")
    with pytest.raises(ValueError, match="would make too many prompt tokens to count"):
        workloads.check_prompt_tokens("chat", float("nan"), "'sessions' × the turns' growing prompts")


@pytest.mark.parametrize("name", ["prefixroute", "gsp", "chat", "viral", "lab-burst"])
def test_the_estimate_is_what_a_shipped_workload_builds(name: str) -> None:
    """The budget means what it says (estimated within a third of the built prompts), and every
    shipped workload is a hundred times within it."""
    estimates: list[float] = []
    with mock.patch.object(
        workloads, "check_prompt_tokens", lambda _n, tokens, *_a: estimates.append(tokens)
    ):
        built = build_workload(name).total_prompt_tokens
    (estimate,) = estimates
    assert 0.75 <= estimate / built <= 1.33
    assert estimate * 100 <= MAX_WORKLOAD_TOKENS


def test_lab_burst_keeps_the_labs_token_ids_in_bytes() -> None:
    """lab-burst now encodes its id ranges directly (a list of ints held 36 bytes a token); its
    prompts are still exactly the lab's, at other sizes too."""
    settings = {"prefix_tokens": 7, "suffix_tokens": 3, "interleaved_requests": 5, "burst_requests": 2}
    workload = build_workload("lab-burst", **settings)
    prompts = [list(memoryview(r.tokens).cast("I")) for r in workload.requests]
    assert prompts == workloads.lab_burst_token_lists(7, 3, 5, 2)
    groups = [f"tenant{(step * 3 + 1) % 4}" for step in range(5)] + ["tenant0"] * 2
    assert [r.group for r in workload.requests] == groups


class Estimated(Exception):
    """Raised by the spy below so a scenario stops before it generates anything."""


@pytest.mark.parametrize("name", ["viral", "diurnal"])
def test_the_shipped_scenarios_are_well_within_the_budget(name: str) -> None:
    """The largest shipped workloads (the diurnal scenario builds 214M tokens in ~40 s) are estimated,
    not built: at least five times within the budget."""
    estimates: list[float] = []

    def record(_name: str, tokens: float, *_rest: object) -> None:
        estimates.append(tokens)
        raise Estimated

    with mock.patch.object(scenarios, "check_prompt_tokens", record), pytest.raises(Estimated):
        scenarios.build_scenario(name)
    (estimate,) = estimates
    assert 1e8 <= estimate <= MAX_WORKLOAD_TOKENS / 5
