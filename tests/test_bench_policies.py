"""`prefixfleet bench policies`: the acceptance benchmark runs and reports what it checks."""

from __future__ import annotations

from pathlib import Path

from prefixfleet.benchmarks.policies import CASES, Case, format_report, run_benchmark
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_reports_every_policy_the_bound_and_a_verdict():
    small = (Case("lab-burst", "lab-burst", "the lab's fleet"),)
    report = run_benchmark(ROOT, progress=False, cases=small)
    case = report["cases"]["lab-burst"]
    assert set(case["policies"]) == {*POLICIES, "ideal"}
    assert report["default_policy"] == DEFAULT_POLICY
    ideal = case["policies"]["ideal"]
    for name in POLICIES:  # nothing beats the bound
        assert case["policies"][name]["mean_ttft_ms"] >= ideal["mean_ttft_ms"] - 1e-6
        assert case["policies"][name]["hit_rate"] <= ideal["hit_rate"] + 1e-9
    assert isinstance(case["pass"], bool) and isinstance(report["pass"], bool)
    assert report["prefixroute_shape"]["round_robin_is_worst"] is True
    assert "lab-burst" in format_report(report)


def test_every_required_case_states_why_its_settings_qualify():
    for case in CASES:
        assert case.why, case.label
    assert any(c.workload.startswith("trace:") for c in CASES)
