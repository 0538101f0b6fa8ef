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

``--seeds 0-8`` judges several draws of the generated workloads in one run: per case, how many seeds
pass and the min - median - max of each ratio. A case whose workload has no seed (lab-burst, a
trace) is simulated once and its result reused for every seed.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES, make_policy
from prefixfleet.sim.engine import ServiceConfig
from prefixfleet.sim.report import summarize
from prefixfleet.sim.simulator import FleetConfig, simulate, simulate_ideal
from prefixfleet.sim.workloads import Workload, build_workload, input_files

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


# run_case results by (case label, workload digest): a seedless workload is simulated once per run
CaseCache = dict[tuple[str, str], dict[str, Any]]


def _digest(workload: Workload) -> str:
    """What the simulation depends on in ``workload``: equal digests, equal runs (it is deterministic)."""
    h = hashlib.blake2b(digest_size=16)
    for r in workload.requests:
        h.update(f"{r.arrival_s!r}/{r.output_tokens}/{len(r.tokens)}|".encode())
        h.update(r.tokens)
    return h.hexdigest()


def run_case(
    case: Case, root: Path, progress: bool, seed: int = 0, cache: CaseCache | None = None
) -> dict[str, Any]:
    # the seed draws the generated workloads (prefixroute, gsp); lab-burst and a trace have none
    workload = build_workload(resolve_trace(case.workload, root), seed=seed, **case.workload_overrides)
    key = (case.label, _digest(workload))
    if cache is not None and key in cache:
        return cache[key]
    result = _simulate_case(case, workload, progress)
    if cache is not None:
        cache[key] = result
    return result


def _simulate_case(case: Case, workload: Workload, progress: bool) -> dict[str, Any]:
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


def prefixroute_shape(
    root: Path, progress: bool, seed: int = 0, cache: CaseCache | None = None
) -> dict[str, Any]:
    """prefixroute's table shape at its own settings: RR worst; affinity policies < 0.2x its mean."""
    case = next(c for c in CASES if c.label == "prefixroute@4x4000")
    res = run_case(case, root, progress, seed, cache)["policies"]
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
    root: Path,
    progress: bool = True,
    cases: tuple[Case, ...] = CASES,
    seed: int = 0,
    cache: CaseCache | None = None,
    announce: bool | None = None,
) -> dict[str, Any]:
    """One seed's report. ``announce``: print each case's name as it starts (default: ``progress``)."""
    cache = {} if cache is None else cache  # the shape reuses the prefixroute@4x4000 case's runs
    announce = progress if announce is None else announce
    report: dict[str, Any] = {"default_policy": DEFAULT_POLICY, "peers": list(PEERS), "seed": seed}
    report["cases"] = {}
    for case in cases:
        if announce:
            print(f"running {case.label} ...", file=sys.stderr, flush=True)
        report["cases"][case.label] = run_case(case, root, progress, seed, cache)
    report["prefixroute_shape"] = prefixroute_shape(root, progress, seed, cache)
    report["pass"] = report["prefixroute_shape"]["pass"] and all(
        c["pass"] for c in report["cases"].values() if c["required"]
    )
    return report


def parse_seeds(text: str) -> list[int]:
    """``0-8``, ``0,3,5`` or ``0-2,7``: distinct non-negative seeds, in the order given."""
    seeds: list[int] = []
    seen: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        low, sep, high = item.partition("-")
        try:
            first = int(low)
            last = int(high) if sep else first
        except ValueError:
            raise ValueError(f"--seeds {text!r}: {item!r} is not a seed or a range like 0-8") from None
        if first < 0 or last < first:
            raise ValueError(f"--seeds {text!r}: {item!r} is not a range of seeds >= 0, low-high")
        for seed in range(first, last + 1):
            if seed in seen:
                raise ValueError(f"--seeds {text!r}: seed {seed} is given twice")
            seen.add(seed)
            seeds.append(seed)
    return seeds


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": round(statistics.median(values), 3),
        "max": max(values),
    }


RATIOS = ("mean_vs_best_peer", "p99_vs_best_peer", "p99_vs_ideal")


def summarize_seeds(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per case over one report per seed: which seeds pass, and each ratio's min - median - max.

    Plain data in, plain data out: ``reports`` are :func:`run_benchmark` reports (each with its
    ``seed``), all over the same cases.
    """
    if not reports:
        raise ValueError("summarize_seeds needs at least one report")
    seeds = [r["seed"] for r in reports]
    cases: dict[str, Any] = {}
    for label, first in reports[0]["cases"].items():
        runs = [r["cases"][label] for r in reports]
        cases[label] = {
            "required": first["required"],
            "passes": sum(c["pass"] for c in runs),
            "passing_seeds": [s for s, c in zip(seeds, runs, strict=True) if c["pass"]],
            **{ratio: _spread([c[ratio] for c in runs]) for ratio in RATIOS},
        }
    shapes = [r["prefixroute_shape"]["pass"] for r in reports]
    return {
        "seeds": seeds,
        "cases": cases,
        "prefixroute_shape": {
            "passes": sum(shapes),
            "passing_seeds": [s for s, ok in zip(seeds, shapes, strict=True) if ok],
        },
        "passing_seeds": [r["seed"] for r in reports if r["pass"]],
    }


def run_seeds(
    root: Path, seeds: Sequence[int], progress: bool = True, cases: tuple[Case, ...] = CASES
) -> dict[str, Any]:
    """:func:`run_benchmark` for each of ``seeds``, and the summary over them."""
    if not seeds:
        raise ValueError("run_seeds needs at least one seed")
    cache: CaseCache = {}
    reports = []
    with tqdm(
        total=len(seeds), desc="bench policies", unit="seed", file=sys.stderr, disable=not progress
    ) as bar:
        for seed in seeds:
            bar.set_postfix_str(f"seed {seed}")
            reports.append(run_benchmark(root, progress, cases, seed, cache, announce=False))
            bar.update(1)
    return {
        "default_policy": DEFAULT_POLICY,
        "peers": list(PEERS),
        "seeds": list(seeds),
        "summary": summarize_seeds(reports),
        "reports": reports,
        "pass": all(r["pass"] for r in reports),
    }


def format_seeds_report(report: dict[str, Any]) -> str:
    summary = report["summary"]
    seeds = summary["seeds"]
    lines = [
        f"default policy: {report['default_policy']}   workload seeds {', '.join(map(str, seeds))}"
        f"   (ratios: default / best of {', '.join(PEERS)}; min - median - max over the seeds)",
        f"{'case':20s} {'passes':>7s}  {'mean ratio':>18s}  {'p99 ratio':>18s}  {'p99 vs ideal':>18s}"
        "  verdict by seed",
    ]
    for label, c in summary["cases"].items():
        by_seed = "".join("P" if s in c["passing_seeds"] else "." for s in seeds)
        spreads = "  ".join(
            f"{c[r]['min']:4.2f} - {c[r]['median']:4.2f} - {c[r]['max']:4.2f}" for r in RATIOS
        )
        note = "" if c["required"] else "  (reference)"
        lines.append(f"{label:20s} {c['passes']:>3d} of {len(seeds):<2d} {spreads}  {by_seed}{note}")
    shape = summary["prefixroute_shape"]
    lines.append(f"prefixroute shape at 4x4000: passes {shape['passes']} of {len(seeds)}")
    passing = summary["passing_seeds"]
    lines.append(f"every required case and the shape pass at seeds: {', '.join(map(str, passing)) or 'none'}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from prefixfleet.cli import UsageError
    from prefixfleet.outputs import output_file, write_json

    root = Path(__file__).resolve().parents[2]
    traces = {path for case in CASES for path in input_files(resolve_trace(case.workload, root))}
    json_path = output_file(args.json, "--json", inputs=sorted(traces))
    try:
        seeds = parse_seeds(args.seeds) if args.seeds is not None else None
        if seeds is None:
            report = run_benchmark(root, progress=not args.quiet, seed=args.seed)
        else:
            report = run_seeds(root, seeds, progress=not args.quiet)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(format_report(report) if seeds is None else format_seeds_report(report))
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
    draws = parser.add_mutually_exclusive_group()
    draws.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the generated workloads (prefixroute, gsp; lab-burst and the trace have none); "
        "default 0",
    )
    draws.add_argument(
        "--seeds",
        metavar="LIST",
        help="judge several seeds in one run, e.g. 0-8 or 0,3,5: per case the pass count and the "
        "min - median - max of each ratio (the JSON keeps every seed's report under 'reports')",
    )
    parser.set_defaults(func=_run)
