"""A setting that must be positive says so for a negative value too.

`prefixfleet sim --workload chat --set sessions=-1` said "must be >= 0", and the ``sessions=0`` that
message allows was then refused as "must be positive": the generic ">= 0" check of every number ran
before each workload's own "positive" one. Both refusals of every positive setting (of every
workload and scenario) now name the same rule, the one the setting is really held to.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from prefixfleet.cli import main
from prefixfleet.sim.scenarios import build_scenario
from prefixfleet.sim.workloads import build_workload

# each builder's settings that must be > 0, as its docs list them
POSITIVE = [
    (build_workload, "workload", "prefixroute", ("num_requests", "tenants", "rate_rps", "prefix_tokens_min")),
    (build_workload, "workload", "lab-burst", ("prefix_tokens", "suffix_tokens", "interarrival_s")),
    (build_workload, "workload", "gsp", ("groups", "prompts_per_group", "rate_rps")),
    (build_workload, "workload", "chat", ("sessions", "system_prompts", "session_rate_rps", "turns_min")),
    (
        build_workload,
        "workload",
        "viral",
        ("duration_s", "tenants", "rate_rps", "viral_prefix_tokens", "surge"),
    ),
    (
        build_scenario,
        "scenario",
        "viral",
        ("duration_s", "tenants", "rate_rps", "viral_prefix_tokens", "surge"),
    ),
    (build_scenario, "scenario", "diurnal", ("duration_s", "tenants", "trough_rps", "peak_rps")),
]
CASES = [(build, kind, spec, key) for build, kind, spec, keys in POSITIVE for key in keys]


@pytest.mark.parametrize(("build", "kind", "spec", "key"), CASES, ids=[f"{c[2]}-{c[3]}" for c in CASES])
@pytest.mark.parametrize("value", ["0", "-1", "-2e0"])
def test_zero_and_a_negative_are_refused_with_the_same_rule(
    build: Callable[..., object], kind: str, spec: str, key: str, value: str
) -> None:
    with pytest.raises(
        ValueError, match=rf"^{kind} '{spec}' setting '{key}' must be positive, got '{value}'$"
    ):
        build(spec, **{key: value})


@pytest.mark.parametrize("key", ["speedup", "block_tokens", "trace_block_tokens"])
def test_a_trace_setting_too(key: str, tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    trace = f"{tmp_path}/t.jsonl"
    with open(trace, "w") as f:
        f.write('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    assert main(["sim", "--workload", f"trace:{trace}", "--set", f"{key}=-1", "--no-progress"]) == 2
    line = f"workload 'trace:{trace}' setting '{key}' must be positive, got '-1'"
    assert capsys.readouterr().err == f"prefixfleet sim: error: {line}\n"


def test_a_count_too_negative_for_a_float_names_the_same_rule() -> None:
    with pytest.raises(
        ValueError, match=r"^workload 'chat' setting 'sessions' must be positive, got '-1e999'$"
    ):
        build_workload("chat", sessions="-1e999")


def test_a_setting_that_may_be_zero_still_says_so() -> None:
    with pytest.raises(ValueError, match=r"^workload 'chat' setting 'turns_max' must be >= 0, got '-1'$"):
        build_workload("chat", turns_max="-1")
