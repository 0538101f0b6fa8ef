"""`prefixfleet bench policies --seeds LIST`: several draws of the generated workloads judged in one run.

docs/policies.md's "Other seeds" table was made by hand from nine `--seed N` runs; ``--seeds`` prints
it: per case the pass count and the min - median - max of each ratio, and keeps every seed's report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import prefixfleet.benchmarks.policies as bench
from prefixfleet.benchmarks.policies import (
    Case,
    format_seeds_report,
    parse_seeds,
    run_seeds,
    summarize_seeds,
)
from prefixfleet.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_seed_lists_and_ranges():
    assert parse_seeds("0-8") == list(range(9))
    assert parse_seeds("0,3,5") == [0, 3, 5]
    assert parse_seeds("4") == [4]
    assert parse_seeds(" 0-2, 7 ") == [0, 1, 2, 7]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "'' is not a seed"),
        ("a", "'a' is not a seed"),
        ("3-1", "'3-1' is not a range"),
        ("-1", "'-1' is not a seed"),
        ("0-", "'0-' is not a seed"),
        ("1,1", "seed 1 is given twice"),
        ("0-3,2", "seed 2 is given twice"),
    ],
)
def test_bad_seed_lists_are_refused_by_name(text: str, says: str):
    with pytest.raises(ValueError, match="--seeds") as err:
        parse_seeds(text)
    assert says in str(err.value)


def _report(seed: int, ratios: dict[str, tuple[float, float, float, bool]], shape: bool) -> dict[str, Any]:
    cases = {
        label: {
            "required": label != "ref",
            "mean_vs_best_peer": mean,
            "p99_vs_best_peer": p99,
            "p99_vs_ideal": ideal,
            "pass": ok,
        }
        for label, (mean, p99, ideal, ok) in ratios.items()
    }
    required_ok = all(c["pass"] for c in cases.values() if c["required"])
    return {
        "seed": seed,
        "cases": cases,
        "prefixroute_shape": {"pass": shape},
        "pass": shape and required_ok,
    }


def test_summary_counts_passes_and_spreads_each_ratio():
    reports = [
        _report(0, {"a": (0.98, 0.5, 2.0, True), "ref": (1.2, 1.0, 3.0, False)}, True),
        _report(3, {"a": (1.05, 0.7, 2.5, False), "ref": (1.0, 0.9, 1.0, True)}, True),
        _report(5, {"a": (1.01, 0.6, 4.0, False), "ref": (1.1, 1.1, 2.0, False)}, False),
    ]
    summary = summarize_seeds(reports)
    assert summary["seeds"] == [0, 3, 5]
    a, ref = summary["cases"]["a"], summary["cases"]["ref"]
    assert (a["passes"], a["passing_seeds"], a["required"]) == (1, [0], True)
    assert (ref["passes"], ref["passing_seeds"], ref["required"]) == (1, [3], False)
    assert a["mean_vs_best_peer"] == {"min": 0.98, "median": 1.01, "max": 1.05}
    assert a["p99_vs_best_peer"] == {"min": 0.5, "median": 0.6, "max": 0.7}
    assert ref["p99_vs_ideal"] == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert summary["prefixroute_shape"] == {"passes": 2, "passing_seeds": [0, 3]}
    # a seed counts as passing only when every required case and the shape pass
    assert summary["passing_seeds"] == [0]
    text = format_seeds_report({"default_policy": "queue_aware", "summary": summary})
    line = next(x for x in text.splitlines() if x.startswith("a "))
    assert "1 of 3" in line and "0.98 - 1.01 - 1.05" in line and line.rstrip().endswith("P..")
    assert "passes 2 of 3" in text
    with pytest.raises(ValueError):
        summarize_seeds([])


def test_cli_takes_seeds_beside_seed_but_not_both():
    parse = build_parser().parse_args
    assert parse(["bench", "policies", "--seeds", "0-8"]).seeds == "0-8"
    assert parse(["bench", "policies"]).seeds is None  # the single-seed report, as before
    with pytest.raises(SystemExit):
        parse(["bench", "policies", "--seed", "1", "--seeds", "0-2"])


def test_run_seeds_reuses_a_seedless_case_and_keeps_each_report(monkeypatch: pytest.MonkeyPatch):
    cases = (
        Case("lab-burst", "lab-burst", "no seed"),
        Case("prefixroute", "prefixroute", "small", workload_overrides={"num_requests": 300}),
    )
    simulated: list[str] = []
    real = bench._simulate_case

    def counting(case: Case, workload: Any, progress: bool) -> dict[str, Any]:
        simulated.append(case.label)
        return real(case, workload, progress)

    monkeypatch.setattr(bench, "_simulate_case", counting)
    report = run_seeds(ROOT, [0, 1], progress=False, cases=cases)
    # lab-burst's workload is the same at every seed: simulated once; prefixroute (and the
    # shape's 4x4000 run) once per seed
    assert simulated.count("lab-burst") == 1
    assert simulated.count("prefixroute") == 2
    assert simulated.count("prefixroute@4x4000") == 2
    assert [r["seed"] for r in report["reports"]] == [0, 1]
    first, second = (r["cases"]["prefixroute"]["policies"] for r in report["reports"])
    assert first != second  # two draws, not one report twice
    summary = report["summary"]["cases"]["prefixroute"]
    ratios = [r["cases"]["prefixroute"]["mean_vs_best_peer"] for r in report["reports"]]
    assert summary["mean_vs_best_peer"]["min"] == min(ratios)
    assert summary["mean_vs_best_peer"]["max"] == max(ratios)
    assert report["pass"] == all(r["pass"] for r in report["reports"])
    json.dumps(report)  # what --json writes
    assert "workload seeds 0, 1" in format_seeds_report(report).splitlines()[0]


def test_a_bad_seed_list_is_one_line_before_anything_runs(capsys: pytest.CaptureFixture[str]):
    from prefixfleet.cli import main

    assert main(["bench", "policies", "--quiet", "--seeds", "5-2"]) == 2
    err = capsys.readouterr().err
    assert "--seeds '5-2'" in err and "Traceback" not in err
