"""Routing-policy acceptance benchmark: is the default policy the best one, by how much, and where?

Runs every policy and the ``ideal`` bound in the simulator on each workload at stated fleet settings
and checks the project's two claims:

* on ``prefixroute`` at prefixroute's own settings, round robin has the worst mean TTFT and both
  affinity policies are below 0.2x of it (prefixroute's published shape);
* the default policy's p99 TTFT is <= 0.8x the best of affinity_balanced / sglang_cache_aware /
  preble_e2, or within 1.1x of the ideal's p99 where the ideal leaves no such room, with a mean TTFT
  no worse than that best -- at settings where the working set exceeds one replica's cache and the
  fleet is busy. The same policy parameters everywhere; only the fleet differs per workload.

Reference rows (the workloads' calibration settings) are reported too, judged but not required.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES, make_policy
from prefixfleet.sim.engine import ServiceConfig
from prefixfleet.sim.report import summarize
from prefixfleet.sim.simulator import FleetConfig, simulate, simulate_ideal
from prefixfleet.sim.workloads import build_workload, input_files

PEERS = ("affinity_balanced", "sglang_cache_aware", "preble_e2")
MOONCAKE = "trace:traces/mooncake_synthetic_trace.jsonl"
_EMULATOR = EmulatorConfig()
# The continuous-batching model with the engine emulator's default timing (docs/emulator.md).
BATCHED: dict[str, Any] = {
    "service": "batched",
    "cached_s_per_token": _EMULATOR.cached_token_cost_s,
    "request_overhead_s": _EMULATOR.prefill_overhead_s,
    "max_running": _EMULATOR.max_running,
    "step_token_budget": _EMULATOR.chunk_tokens,
    "decode_base_s": _EMULATOR.decode_step_s,
    "decode_s_per_seq": _EMULATOR.decode_step_per_req_s,
}


@dataclass(frozen=True)
class Case:
    label: str
    workload: str
    why: str
    workload_overrides: dict[str, Any] = field(default_factory=dict)
    fleet_overrides: dict[str, Any] = field(default_factory=dict)
    required: bool = True


CASES: tuple[Case, ...] = (
    Case(
        "prefixroute",
        "prefixroute",
        "4 replicas x 6000-token caches: 12 tenant prefixes (~10k tokens) exceed one cache; "
        "round robin keeps replicas 62% busy",
        fleet_overrides={"cache_tokens": 6000},
    ),
    Case(
        "lab-burst",
        "lab-burst",
        "the lab's fleet: 4 x 9216-token caches, 4 x 4096-token prefixes, a burst on one",
    ),
    Case(
        "gsp",
        "gsp",
        "8 replicas x 24k-token caches at 96 req/s: 131k tokens of system prompts, round robin 89% busy",
        workload_overrides={"rate_rps": 96.0},
        fleet_overrides={"replicas": 8, "cache_tokens": 24_000},
    ),
    Case("mooncake", MOONCAKE, "the trace's calibration fleet: 8 replicas x 1M tokens, real timestamps"),
    Case(
        "prefixroute@4x4000",
        "prefixroute",
        "prefixroute's own settings (reference): full-prefix misses set every policy's p99",
        required=False,
    ),
    Case(
        "prefixroute batched",
        "prefixroute",
        "continuous batching (reference), 4 x 16k-token caches shared by the running batch, 30 req/s",
        workload_overrides={"rate_rps": 30.0},
        fleet_overrides={**BATCHED, "cache_tokens": 16_000},
        required=False,
    ),
    Case(
        "gsp batched",
        "gsp",
        "continuous batching (reference), 8 x 60k-token caches at 48 req/s",
        workload_overrides={"rate_rps": 48.0},
        fleet_overrides={**BATCHED, "replicas": 8, "cache_tokens": 60_000},
        required=False,
    ),
    Case(
        "gsp@4x40k",
        "gsp",
        "calibration settings (reference): the cold-start storm of 64 groups sets every policy's p99",
        required=False,
    ),
)


def resolve_trace(spec: str, root: Path) -> str:
    """Trace paths in CASES are relative to the repository root, not the working directory."""
    if spec.startswith("trace:") and not Path(spec[6:]).is_absolute():
        return "trace:" + str((root / spec[6:]).resolve())
    return spec


def run_case(case: Case, root: Path, progress: bool, seed: int = 0) -> dict[str, Any]:
    # the seed draws the generated workloads (prefixroute, gsp); lab-burst and a trace have none
    workload = build_workload(resolve_trace(case.workload, root), seed=seed, **case.workload_overrides)
    settings = {**workload.recommended, **case.fleet_overrides}
    service = ServiceConfig(**{k: v for k, v in settings.items() if k in ServiceConfig.__dataclass_fields__})
    fleet = FleetConfig(settings["replicas"], settings["cache_tokens"], service)
    results: dict[str, dict[str, Any]] = {}
    for name in POLICIES:
        run = simulate(workload.requests, make_policy(name, service.cost), fleet, progress=progress)
        results[name] = summarize(run)
    results["ideal"] = summarize(simulate_ideal(workload.requests, fleet))
    best_p99 = min(results[p]["p99_ttft_ms"] for p in PEERS)
    best_mean = min(results[p]["mean_ttft_ms"] for p in PEERS)
    default = results[DEFAULT_POLICY]
    ideal_p99 = results["ideal"]["p99_ttft_ms"]
    p99_ok = default["p99_ttft_ms"] <= 0.8 * best_p99 or default["p99_ttft_ms"] <= 1.1 * ideal_p99
    return {
        "workload": case.workload,
        "why": case.why,
        "required": case.required,
        "settings": {"fleet": settings, "workload": workload.settings},
        "policies": {k: _slim(v) for k, v in results.items()},
        "default_policy": DEFAULT_POLICY,
        "p99_vs_best_peer": round(default["p99_ttft_ms"] / best_p99, 3),
        "p99_vs_ideal": round(default["p99_ttft_ms"] / ideal_p99, 3),
        "mean_vs_best_peer": round(default["mean_ttft_ms"] / best_mean, 3),
        "pass": bool(p99_ok and default["mean_ttft_ms"] <= best_mean),
    }


def _slim(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "hit_rate", "prefill_tokens", "max_replica_share")
    return {k: summary[k] for k in keys}


def prefixroute_shape(root: Path, progress: bool, seed: int = 0) -> dict[str, Any]:
    """prefixroute's table shape at its own settings: RR worst; affinity policies < 0.2x its mean."""
    case = next(c for c in CASES if c.label == "prefixroute@4x4000")
    res = run_case(case, root, progress, seed)["policies"]
    rr = res["round_robin"]["mean_ttft_ms"]
    worst = max(res[p]["mean_ttft_ms"] for p in POLICIES)
    ratios = {p: round(res[p]["mean_ttft_ms"] / rr, 3) for p in ("affinity", "affinity_balanced")}
    return {
        "round_robin_mean_ttft_ms": rr,
        "round_robin_is_worst": rr >= worst,
        "mean_ratio_to_round_robin": ratios,
        "pass": rr >= worst and all(r < 0.2 for r in ratios.values()),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"default policy: {report['default_policy']}   workload seed {report['seed']}"
        f"   (ratios: default / best of {', '.join(PEERS)})",
        f"{'case':20s} {'default mean/p99 ms':>20s} {'best peer mean/p99':>20s} {'ideal p99':>10s}"
        f" {'p99 ratio':>9s} {'vs ideal':>8s} {'mean ratio':>10s}  verdict",
    ]
    for label, c in report["cases"].items():
        pol = c["policies"]
        d = pol[report["default_policy"]]
        bm = min(pol[p]["mean_ttft_ms"] for p in PEERS)
        bp = min(pol[p]["p99_ttft_ms"] for p in PEERS)
        verdict = "PASS" if c["pass"] else "FAIL"
        if not c["required"]:
            verdict = f"({verdict.lower()}, reference)"
        lines.append(
            f"{label:20s} {d['mean_ttft_ms']:9.1f}/{d['p99_ttft_ms']:<10.1f} {bm:9.1f}/{bp:<10.1f}"
            f" {pol['ideal']['p99_ttft_ms']:10.1f} {c['p99_vs_best_peer']:9.2f} {c['p99_vs_ideal']:8.2f}"
            f" {c['mean_vs_best_peer']:10.2f}  {verdict}"
        )
    shape = report["prefixroute_shape"]
    lines.append(
        f"prefixroute shape at 4x4000: round robin worst={shape['round_robin_is_worst']}, "
        f"affinity/rr={shape['mean_ratio_to_round_robin']['affinity']}, "
        f"affinity_balanced/rr={shape['mean_ratio_to_round_robin']['affinity_balanced']}  "
        f"{'PASS' if shape['pass'] else 'FAIL'}"
    )
    return "\n".join(lines)


def run_benchmark(
    root: Path, progress: bool = True, cases: tuple[Case, ...] = CASES, seed: int = 0
) -> dict[str, Any]:
    report: dict[str, Any] = {"default_policy": DEFAULT_POLICY, "peers": list(PEERS), "seed": seed}
    report["cases"] = {}
    for case in cases:
        if progress:
            print(f"running {case.label} ...", file=sys.stderr, flush=True)
        report["cases"][case.label] = run_case(case, root, progress, seed)
    report["prefixroute_shape"] = prefixroute_shape(root, progress, seed)
    report["pass"] = report["prefixroute_shape"]["pass"] and all(
        c["pass"] for c in report["cases"].values() if c["required"]
    )
    return report


def _run(args: argparse.Namespace) -> int:
    from prefixfleet.cli import UsageError
    from prefixfleet.outputs import output_file, write_json

    root = Path(__file__).resolve().parents[2]
    traces = {path for case in CASES for path in input_files(resolve_trace(case.workload, root))}
    json_path = output_file(args.json, "--json", inputs=sorted(traces))
    try:
        report = run_benchmark(root, progress=not args.quiet, seed=args.seed)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(format_report(report))
    if json_path is not None:
        write_json(json_path, report)
        print(f"wrote {json_path}")
    return 0


def add_bench(bench_subparsers: argparse._SubParsersAction) -> None:
    parser = bench_subparsers.add_parser(
        "policies",
        help="every routing policy in the simulator at the acceptance settings; is the default the best?",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the generated workloads (prefixroute, gsp; lab-burst and the trace have none); "
        "default 0",
    )
    parser.set_defaults(func=_run)
