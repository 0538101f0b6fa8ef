"""`prefixfleet bench policies --seed N`: the acceptance benchmark on another draw of its workloads.

One seed's draw decides some verdicts (docs/policies.md, "Other seeds"), so the benchmark takes the
seed of its generated workloads; the default stays 0, the draw the published tables come from.
"""

from __future__ import annotations

from pathlib import Path

from prefixfleet.benchmarks.policies import Case, format_report, run_case
from prefixfleet.cli import build_parser
from prefixfleet.sim.workloads import build_workload

ROOT = Path(__file__).resolve().parents[1]
# prefixroute shrunk to 300 requests: each run_case simulates every policy, so keep it small
SMALL = Case("prefixroute", "prefixroute", "small", workload_overrides={"num_requests": 300})


def _ttfts(seed: int | None) -> dict[str, float]:
    case = run_case(SMALL, ROOT, False) if seed is None else run_case(SMALL, ROOT, False, seed)
    return {name: p["mean_ttft_ms"] for name, p in case["policies"].items()}


def test_the_seed_draws_the_workload_and_zero_is_the_default():
    # the workloads themselves differ between seeds (else the comparison below proves nothing)
    a, b = (build_workload("prefixroute", seed=s, num_requests=300).requests for s in (0, 1))
    assert [r.tokens for r in a] != [r.tokens for r in b]
    default, zero, one = _ttfts(None), _ttfts(0), _ttfts(1)
    assert default == zero
    assert one != zero


def test_cli_takes_the_seed_and_the_report_names_it():
    args = build_parser().parse_args(["bench", "policies", "--seed", "3", "--quiet"])
    assert args.seed == 3
    assert build_parser().parse_args(["bench", "policies"]).seed == 0
    case = run_case(SMALL, ROOT, False, 2)
    report = {
        "default_policy": "queue_aware",
        "seed": 2,
        "cases": {"prefixroute": case},
        "prefixroute_shape": {
            "round_robin_is_worst": True,
            "mean_ratio_to_round_robin": {"affinity": 0.1, "affinity_balanced": 0.1},
            "pass": True,
        },
    }
    assert "workload seed 2" in format_report(report).splitlines()[0]
