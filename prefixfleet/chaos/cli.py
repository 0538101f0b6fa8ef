"""`prefixfleet chaos engine-kill|redis-outage|gateway-kill|soak`: fault benchmarks on a local fleet.

Each command starts its own fleet of real processes on 127.0.0.1, drives fixed-rate traffic through
the gateways, injects its fault, prints the figures and writes them as JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from prefixfleet.cli import DefaultsHelpFormatter


def _usage_error(message: str) -> Exception:
    from prefixfleet.cli import UsageError

    return UsageError(message)


MAX_REQUESTS = 1_000_000  # a local fleet on a few cores serves hundreds per second

SCENARIOS = {
    # name: (help, default rate, default duration, default stream fraction)
    "engine-kill": ("kill 1 of N engines and its sidecar mid-run", 40.0, 20.0, 0.5),
    "redis-outage": ("stop Redis for --outage seconds, restart it empty, time the recovery", 30.0, 50.0, 0.3),
    "gateway-kill": (
        "kill 1 of 2 gateways mid-run; the client retries on connection errors",
        40.0,
        20.0,
        0.3,
    ),
    "soak": ("hold a fixed rate on fresh prefixes; RSS over time, latency, errors", 40.0, 60.0, 0.2),
}


def register(subparsers: Any) -> None:
    chaos = subparsers.add_parser("chaos", help="fault and soak benchmarks on a local fleet (real processes)")
    sub = chaos.add_subparsers(dest="chaos_command", metavar="SCENARIO", required=True)
    for name, (text, rate, duration, streams) in SCENARIOS.items():
        p = sub.add_parser(name, help=text, description=text, formatter_class=DefaultsHelpFormatter)
        p.add_argument("--rate", type=float, default=rate, help=f"requests per second (default {rate:g})")
        p.add_argument(
            "--duration", type=float, default=duration, help=f"seconds of traffic (default {duration:g})"
        )
        p.add_argument("--replicas", type=int, default=4, help="engines, each behind a sidecar (default 4)")
        p.add_argument(
            "--gateways", type=int, default=1 if name == "soak" else 2, help="gateways, requests alternate"
        )
        p.add_argument("--time-scale", type=float, default=4.0, help="emulator speed-up (default 4)")
        p.add_argument(
            "--cache-tokens", type=int, default=40_000, help="each emulator's KV cache (default 40000)"
        )
        tokens = 200 if name == "engine-kill" else 24  # long enough that streams are cut mid-way
        p.add_argument(
            "--max-tokens", type=int, default=tokens, help=f"output tokens per request (default {tokens})"
        )
        p.add_argument("--stream-fraction", type=float, default=streams, help="share of streamed requests")
        p.add_argument("--policy", default=None, help="routing policy (default: the project's default)")
        p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the report here")
        p.add_argument("--run-dir", type=Path, default=None, help="process logs (default: a temp dir)")
        if name == "redis-outage":
            p.add_argument("--outage", type=float, default=30.0, help="seconds Redis stays down (default 30)")
        p.set_defaults(func=run, chaos_scenario=name)
    every = sub.add_parser(
        "all",
        help="run every scenario with its defaults",
        description="Run every scenario with its defaults.",
    )
    every.add_argument(
        "--json-dir", type=Path, required=True, metavar="DIR", help="one SCENARIO.json per run"
    )
    every.set_defaults(func=run_all)


def _plan(args: argparse.Namespace) -> Any:
    from .traffic import TrafficPlan

    plan = TrafficPlan(
        rate_per_s=args.rate,
        duration_s=args.duration,
        stream_fraction=args.stream_fraction,
        max_tokens=args.max_tokens,
        unique_prefixes=args.chaos_scenario == "soak",
        client_retries=1 if args.chaos_scenario == "gateway-kill" else 0,
    )
    problems = plan.problems()
    if not problems and plan.rate_per_s * plan.duration_s > MAX_REQUESTS:
        # the sender schedules rate × duration requests, however long they take to send
        problems.append(
            f"--rate × --duration is {plan.rate_per_s * plan.duration_s:.3g} requests; "
            f"at most {MAX_REQUESTS:,}"
        )
    if args.replicas < (2 if args.chaos_scenario == "engine-kill" else 1):
        problems.append(f"--replicas must be at least 2 for engine-kill, got {args.replicas}")
    if args.gateways < (2 if args.chaos_scenario == "gateway-kill" else 1):
        problems.append(f"--gateways must be at least 2 for gateway-kill, got {args.gateways}")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        problems.append(f"--time-scale must be positive, got {args.time_scale}")
    else:
        from prefixfleet.emulator.cli import TIME_SCALE_RANGE

        least, most = TIME_SCALE_RANGE  # the engines' own bounds: past them each refuses to start
        if not least <= args.time_scale <= most:
            problems.append(f"--time-scale must be between {least:g} and {most:g}, got {args.time_scale:g}")
    if args.cache_tokens < 1000:
        problems.append(f"--cache-tokens must be at least 1000, got {args.cache_tokens}")
    outage = getattr(args, "outage", 1.0)
    if not (math.isfinite(outage) and outage > 0):
        problems.append(f"--outage must be positive, got {outage}")
    elif args.chaos_scenario == "redis-outage" and not problems:
        from .scenarios import redis_stop_at

        # a restart after the last request measures no recovery under load (and past the fault's
        # 120 s after the traffic, no restart at all)
        stop_at = redis_stop_at(plan.duration_s)
        if stop_at + outage >= plan.duration_s:
            problems.append(
                f"--outage must end before the traffic does: Redis stops at {stop_at:g} s (--duration / 5), "
                f"so --outage must be below {plan.duration_s - stop_at:g} s, got {outage:g}"
            )
    if problems:
        raise _usage_error("; ".join(problems))
    return plan


def run(args: argparse.Namespace) -> int:
    from prefixfleet.outputs import output_dir, output_file, write_json
    from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES

    from . import scenarios
    from .report import format_report

    plan = _plan(args)
    json_path = output_file(args.json, "--json")
    output_dir(args.run_dir, "--run-dir")
    policy = DEFAULT_POLICY if args.policy is None else args.policy  # '' is no policy name
    if policy not in POLICIES:
        raise _usage_error(f"unknown --policy {policy!r}; choose from {', '.join(sorted(POLICIES))}")
    fleet = scenarios.ChaosFleet(
        replicas=args.replicas,
        gateways=args.gateways,
        time_scale=args.time_scale,
        cache_tokens=args.cache_tokens,
        policy=policy,
    )
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"pf-chaos-{args.chaos_scenario}-"))
    total = plan.duration_s
    from tqdm import tqdm

    bar = tqdm(total=round(total), unit="s", desc=f"{args.chaos_scenario} (fleet starting)", file=sys.stderr)

    def tick(elapsed: float) -> None:  # called from the first scheduled send on
        if bar.desc != args.chaos_scenario:
            bar.set_description(args.chaos_scenario)
        bar.n = min(round(elapsed), bar.total)
        bar.refresh()

    calls: dict[str, Callable[[], Coroutine[Any, Any, dict[str, Any]]]] = {
        "engine-kill": lambda: scenarios.engine_kill(run_dir, plan, fleet, on_tick=tick),
        "redis-outage": lambda: scenarios.redis_outage(
            run_dir, plan, fleet, outage_s=args.outage, on_tick=tick
        ),
        "gateway-kill": lambda: scenarios.gateway_kill(run_dir, plan, fleet, on_tick=tick),
        "soak": lambda: scenarios.soak(run_dir, plan, fleet, on_tick=tick),
    }
    from prefixfleet.fleet.cli import claimed, run_fleet_main

    async def scenario() -> dict[str, Any]:
        try:
            return await calls[args.chaos_scenario]()
        finally:
            bar.close()  # before any error line, which would otherwise continue the bar's line

    # as `up` runs its fleet: a fleet process that fails is one line naming it and its log (exit 1),
    # and SIGTERM, like Ctrl-C, stops every process the run started
    command = getattr(args, "command_prog", f"prefixfleet chaos {args.chaos_scenario}")
    try:
        # a --run-dir another run holds is refused: its logs (redis-outage counts lines in them)
        # would mix both fleets'
        with claimed(args.run_dir):
            report = run_fleet_main(scenario, command)
    finally:
        bar.close()
    report["run_dir"] = str(run_dir)
    print(format_report(report))
    if json_path:
        write_json(json_path, report)
        print(f"wrote {json_path}")
    return 0


def run_all(args: argparse.Namespace) -> int:
    """Every scenario in turn with its default settings, each writing ``DIR/<scenario>.json``."""
    from prefixfleet.cli import build_parser
    from prefixfleet.outputs import output_dir

    output_dir(args.json_dir, "--json-dir")  # before the first scenario's minutes, not after them
    parser = build_parser("chaos")
    for name in SCENARIOS:
        scenario_args = parser.parse_args(["chaos", name, "--json", str(args.json_dir / f"{name}.json")])
        run(scenario_args)
    return 0
