"""The fleet commands' argument checking, and the pure pieces they rest on."""

from __future__ import annotations

import math
import random

import pytest

from prefixfleet.cli import main
from prefixfleet.fleet.ranking import (
    compare_rankings,
    compare_resolved,
    kendall_tau,
    paired_order,
    rank_policies,
)
from prefixfleet.fleet.sampling import sample_groups
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES
from prefixfleet.sim.cli import policy_names
from prefixfleet.sim.workloads import Workload, WorkloadRequest


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--replicas", "0"], "--replicas must be at least 1"),
        (["up", "--gateways", "0"], "--gateways must be at least 1"),
        (["up", "--policies", "fastest"], "unknown policy 'fastest'"),
        (["up", "--policies", ","], "--policies is empty"),
        (["up", "--workload", "nope"], "unknown workload 'nope'"),
        (["up", "--time-scale", "0"], "--time-scale must be positive"),
        # the emulator's bounds on the flags passed to every engine child: refused before any starts
        (["up", "--time-scale", "1e-300"], "--time-scale must be between 0.001 and 1e+06, got 1e-300"),
        (["up", "--time-scale", "2e6"], "--time-scale must be between 0.001 and 1e+06, got 2e+06"),
        (["up", "--prefill-tokens-per-s", "1e-300"], "--prefill-tokens-per-s must be between 1 and 1e+12"),
        (["compare", "--json", "x.json", "--time-scale", "1e-300"], "--time-scale must be between 0.001"),
        (["compare", "--json", "x.json", "--prefill-tokens-per-s", "1e13"], "between 1 and 1e+12, got 1e+13"),
        # a rate derived from the workload too (its fleet's prefill spread over a million engines)
        (["up", "--replicas", "1000000", "--requests", "10"], "prefill rate per engine is 0.04 tokens/s"),
        (
            ["compare", "--json", "x.json", "--workload", "prefixroute", "--replicas", "1000000"],
            "outside the emulator's 1 to 1e+12; give --prefill-tokens-per-s",
        ),
        (["up", "--set", "tenants"], "must look like KEY=VALUE"),
        (["up", "--set", "colour=blue"], "has no setting 'colour'"),
        (["load", "--target", "ftp://x", "--workload", "prefixroute"], "--target must be an http"),
        (
            ["load", "--target", "http://127.0.0.1:9", "--workload", "prefixroute", "--speedup", "-1"],
            "--speedup",
        ),
        (["compare", "--json", "x.json", "--requests", "0"], "--requests must be positive"),
        (["compare", "--json", "x.json", "--trace", "/no/such/trace.jsonl"], "trace was not found"),
        (["compare", "--json", "x.json", "--workload", "trace:/no/such.jsonl"], "trace file not found"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_argparse_type_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["up", "--replicas", "many"])
    assert exit_info.value.code == 2


def test_policy_names_expand_default_and_all() -> None:
    assert policy_names("default") == (DEFAULT_POLICY,)
    assert policy_names("all") == tuple(POLICIES)
    assert policy_names("default, round_robin,default") == (DEFAULT_POLICY, "round_robin")


def test_kendall_tau_and_rankings() -> None:
    assert kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    assert kendall_tau(["a", "b", "c"], ["b", "a", "c"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="same distinct items"):
        kendall_tau(["a", "b"], ["a", "c"])
    metrics = {"rr": {"mean_ttft_ms": 9.0}, "qa": {"mean_ttft_ms": 2.0}, "bad": {"mean_ttft_ms": math.nan}}
    assert rank_policies(metrics) == ["qa", "rr", "bad"]
    verdict = compare_rankings(metrics, {"qa": {"mean_ttft_ms": 5.0}, "rr": {"mean_ttft_ms": 3.0}})
    assert verdict["sim_order"] == ["qa", "rr"] and verdict["live_order"] == ["rr", "qa"]
    assert verdict["kendall_tau"] == -1.0 and not verdict["same_best"]


def test_paired_order_resolves_real_differences_and_ties_noise() -> None:
    rng = random.Random(7)
    base = [rng.expovariate(1 / 100.0) for _ in range(600)]
    faster = [t * 0.5 for t in base]
    noisy = [t + rng.gauss(0.0, 30.0) for t in base]  # same policy measured twice: only noise differs
    assert paired_order(faster, base) == -1
    assert paired_order(base, faster) == 1
    assert paired_order(noisy, base) == 0
    assert paired_order(base[:10], faster[:10]) == 0  # too few requests to resolve anything
    with pytest.raises(ValueError, match="same length"):
        paired_order(base, base[:-1])
    with_failures = [math.nan if i % 7 == 0 else t for i, t in enumerate(faster)]
    assert paired_order(with_failures, base) == -1  # failed requests are left out of the pairs


def test_resolved_agreement_counts_contradictions_not_noise() -> None:
    rng = random.Random(3)
    base = [rng.expovariate(1 / 100.0) for _ in range(600)]
    sim = {"rr": base, "qa": [t * 0.3 for t in base], "pe": [t * 0.31 for t in base]}
    live_tied = {"rr": base, "qa": [t * 0.3 + rng.gauss(0, 20) for t in base], "pe": [t * 0.3 for t in base]}
    rows = {n: {"mean_ttft_ms": sum(v) / len(v)} for n, v in sim.items()}
    live_rows = {n: {"mean_ttft_ms": sum(v) / len(v)} for n, v in live_tied.items()}
    verdict = compare_resolved(sim, live_tied, rows, live_rows)
    assert verdict["agree"] and ["pe", "qa"] in verdict["unresolved_pairs"]
    assert verdict["live_tiers"][-1] == ["rr"] and sorted(verdict["live_tiers"][0]) == ["pe", "qa"]
    live_flipped = {
        "rr": [t * 0.2 for t in base],
        "qa": [t * 0.3 for t in base],
        "pe": [t * 0.31 for t in base],
    }
    flipped_rows = {n: {"mean_ttft_ms": sum(v) / len(v)} for n, v in live_flipped.items()}
    verdict = compare_resolved(sim, live_flipped, rows, flipped_rows)
    assert not verdict["agree"] and ["qa", "rr"] in verdict["contradicting_pairs"]


def test_sampling_keeps_whole_groups_and_the_arrival_rate() -> None:
    reqs = [WorkloadRequest(float(i), b"\0\0\0\0", 1, f"g{i % 10}") for i in range(100)]
    sampled = sample_groups(Workload("w", reqs), 30, seed=1)
    groups = {r.group for r in sampled.requests}
    assert len(sampled.requests) == 10 * len(groups) >= 30  # every chosen group complete
    fraction = len(sampled.requests) / 100
    span = sampled.requests[-1].arrival_s - sampled.requests[0].arrival_s
    original_span = max(r.arrival_s for r in reqs if r.group in groups) - min(
        r.arrival_s for r in reqs if r.group in groups
    )
    assert span == pytest.approx(original_span * fraction)  # same requests per second as the original
    assert sampled.settings["sampled_requests"] == len(sampled.requests)
    whole = Workload("w", reqs)
    assert sample_groups(whole, 500) is whole  # already small enough: untouched


def test_engines_carry_the_recommended_fleet_capacity_scaled_with_the_trace() -> None:
    from prefixfleet.fleet.local import engine_for_workload

    # 8 recommended replicas of 1M tokens at 10k tok/s; prompts shrunk 512 -> 16; 25% of groups kept
    reqs = [WorkloadRequest(0.0, b"\0\0\0\0" * 100, 1, "g")]
    trace = Workload(
        "trace:x",
        reqs,
        settings={"block_tokens": 16, "trace_block_tokens": 512, "sampled_fraction": 0.25},
        recommended={"replicas": 8, "cache_tokens": 1_000_000, "prefill_s_per_token": 0.0001},
    )
    engine = engine_for_workload(trace, 4, time_scale=2.0, output_tokens=4)
    assert engine.cache_tokens == round(1_000_000 * (16 / 512) * 2 * 0.25)
    assert engine.prefill_tokens_per_s == pytest.approx(10_000 * (16 / 512) * 2)
    assert engine.time_scale == 2.0
    tiny = engine_for_workload(trace, 4, time_scale=1.0, cache_tokens=None, output_tokens=4)
    assert tiny.cache_tokens >= 100 + 4 + 1  # never below the longest request
    assert engine_for_workload(trace, 4, time_scale=1.0, cache_tokens=777).cache_tokens == 777


def test_metric_series_reads_prometheus_text() -> None:
    from prefixfleet.fleet.compare import metric_series

    text = (
        "# HELP sglang:num_requests_total x\n"
        'sglang:num_requests_total{model_name="m"} 12.0\n'
        "sglang:num_requests_total_created 1.7e9\n"
        'prefixfleet_gateway_routing_decisions_total{policy="qa",reason="cache_hit"} 3\n'
    )
    assert metric_series(text, "sglang:num_requests_total") == {'{model_name="m"}': 12.0}
    assert sum(metric_series(text, "prefixfleet_gateway_routing_decisions_total").values()) == 3.0
