"""`prefixfleet sim-autoscale`: compare scalers on one scenario over an elastic simulated fleet."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from prefixfleet.cli import UsageError, check_positive, counted
from prefixfleet.operator.autoscale import SCALER_MODES, ScalePolicy
from prefixfleet.outputs import distinct_outputs, output_file, write_json, writing
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES

from .autoscale import ElasticConfig, ElasticRun, simulate_elastic
from .autoscale_report import format_table, run_details, scaler_metrics, write_plot
from .cli import add_service_arguments, check_kv_pool, parse_names, parse_settings, service_config
from .scenarios import SCENARIO_FLEET, SCENARIOS, build_scenario
from .workloads import input_files, settings_help

MAX_CONTROL_ROUNDS = 10_000_000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim-autoscale",
        help="simulate an elastic fleet: compare autoscalers on a scenario",
        description=(
            "Replays a scenario over a simulated fleet whose replicas are added (start-up delay, "
            "optional pre-warm) and drained by each scaler, all with the same routing policy."
        ),
    )
    p.add_argument("--scenario", required=True, metavar="S", help=f"one of: {', '.join(SCENARIOS)}")
    p.add_argument("--scalers", default="all", help=f"'all' or a comma list of {', '.join(SCALER_MODES)}")
    p.add_argument("--policy", default=DEFAULT_POLICY, help=f"routing policy (default {DEFAULT_POLICY})")
    p.add_argument("--min", type=int, dest="min_replicas", help="minReplicas (default: the scenario's)")
    p.add_argument("--max", type=int, dest="max_replicas", help="maxReplicas (default: the scenario's)")
    p.add_argument("--initial", type=int, help="replicas at t=0 (default minReplicas; fixed_max: max)")
    p.add_argument("--target-ttft-ms", type=float, help="TTFT SLO in ms (default: the scenario's)")
    p.add_argument("--startup-delay-s", type=float, default=30.0, help="new replica start-up time (30)")
    p.add_argument("--control-interval-s", type=float, default=5.0, help="control loop period (5)")
    p.add_argument(
        "--scale-up-cooldown-s",
        type=float,
        default=SCENARIO_FLEET["scale_up_cooldown_s"],
        help="time between scale-ups (default: the scenario's, %(default)g)",
    )
    p.add_argument(
        "--scale-down-stabilization-s",
        type=float,
        default=SCENARIO_FLEET["scale_down_stabilization_s"],
        help="quiet time before a scale-down (default: the scenario's, %(default)g)",
    )
    p.add_argument("--cache-tokens", type=int, help="KV cache per replica in tokens")
    add_service_arguments(p, "batched")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="scenario_settings",
        metavar="KEY=VALUE",
        help=settings_help("scenario", {"viral": "duration_s=300, surge=5", "trace:PATH": "speedup=8"}),
    )
    p.add_argument("--seed", type=int, default=0, help="scenario seed (default 0)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write replicas and p99 TTFT over time")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    scalers = parse_names(args.scalers, SCALER_MODES, "--scalers", "scaler")
    json_path = output_file(args.json, "--json", inputs=input_files(args.scenario))
    plot_path = output_file(args.plot, "--plot", suffix=".png", inputs=input_files(args.scenario))
    distinct_outputs({"--json": json_path, "--plot": plot_path}, {})
    if args.policy not in POLICIES:
        raise UsageError(f"unknown routing policy {args.policy!r}; choose from {', '.join(POLICIES)}")
    if args.scenario not in SCENARIOS[:-1] and not args.scenario.startswith("trace:"):
        raise UsageError(f"unknown scenario {args.scenario!r}; choose from {', '.join(SCENARIOS)}")
    rec = dict(SCENARIO_FLEET)  # every scenario is judged on the same fleet: check flags before building
    min_r = args.min_replicas if args.min_replicas is not None else rec["min_replicas"]
    max_r = args.max_replicas if args.max_replicas is not None else rec["max_replicas"]
    target_s = args.target_ttft_ms / 1000.0 if args.target_ttft_ms is not None else rec["target_ttft_s"]
    cache = args.cache_tokens if args.cache_tokens is not None else rec["cache_tokens"]
    cooldown, stabilization = args.scale_up_cooldown_s, args.scale_down_stabilization_s
    if min_r < 1:
        raise UsageError(f"--min must be at least 1 (someone has to serve), got {min_r}")
    if max_r < min_r:
        raise UsageError(f"--max ({max_r}) must be >= --min ({min_r})")
    if args.target_ttft_ms is not None:  # checked in the flag's unit: the message echoes what was typed
        check_positive("--target-ttft-ms", args.target_ttft_ms)
    check_positive("--cache-tokens", cache)
    check_positive("--startup-delay-s", args.startup_delay_s, allow_zero=True)
    check_positive("--control-interval-s", args.control_interval_s)
    check_positive("--scale-up-cooldown-s", cooldown, allow_zero=True)
    check_positive("--scale-down-stabilization-s", stabilization, allow_zero=True)
    if args.initial is not None and not min_r <= args.initial <= max_r:
        raise UsageError(f"--initial ({args.initial}) must be between --min ({min_r}) and --max ({max_r})")
    service = service_config(rec, args)
    settings = parse_settings(args.scenario_settings, "scenario")
    try:
        workload = build_scenario(args.scenario, seed=args.seed, **settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not workload.requests:
        raise UsageError(f"scenario {args.scenario!r} has no requests with these settings")
    check_kv_pool(workload.requests, cache, service)
    rounds = workload.requests[-1].arrival_s / args.control_interval_s
    if rounds > MAX_CONTROL_ROUNDS:  # 1e-300 s never finished: a control round per interval
        # 1e-320 s overflows the count: "makes inf control rounds" named no number
        many = f"{rounds:.3g} control rounds" if math.isfinite(rounds) else "too many control rounds to count"
        raise UsageError(
            f"--control-interval-s {args.control_interval_s:g} makes {many} over "
            f"the scenario's {workload.requests[-1].arrival_s:g} s; at most {MAX_CONTROL_ROUNDS:,}"
        )

    runs: list[ElasticRun] = []
    metrics: dict[str, dict[str, Any]] = {}
    details: dict[str, dict[str, Any]] = {}
    for name in scalers:
        policy = ScalePolicy(
            mode=name,  # type: ignore[arg-type]
            min_replicas=min_r,
            max_replicas=max_r,
            target_ttft_s=target_s,
            prefill_s_per_token=service.prefill_s_per_token,
            lead_time_s=args.startup_delay_s,  # look as far ahead as a new replica takes to start
            scale_up_cooldown_s=cooldown,
            scale_down_stabilization_s=stabilization,
        )
        config = ElasticConfig(
            cache_tokens=cache,
            policy=policy,
            service=service,
            initial_replicas=args.initial if name != "fixed_max" else None,
            startup_delay_s=args.startup_delay_s,
            control_interval_s=args.control_interval_s,
            routing_policy=args.policy,
        )
        result = simulate_elastic(workload.requests, config, progress=args.progress, label=name)
        runs.append(result)
        metrics[name] = scaler_metrics(result, target_s)
        details[name] = run_details(result)
    settings = {
        "seed": args.seed,
        "routing_policy": args.policy,
        "min_replicas": min_r,
        "max_replicas": max_r,
        "initial_replicas": args.initial if args.initial is not None else min_r,
        "target_ttft_ms": round(target_s * 1000.0, 3),
        "startup_delay_s": args.startup_delay_s,
        "control_interval_s": args.control_interval_s,
        "scale_up_cooldown_s": cooldown,
        "scale_down_stabilization_s": stabilization,
        "prewarm_subtrees": ScalePolicy().prewarm_subtrees,
        "cache_tokens": cache,
        **service.as_dict(),
        "requests": len(workload.requests),
        "duration_s": round(workload.requests[-1].arrival_s, 3),
        "scenario": workload.settings,
        "new_replica_window_s": 30.0,
    }
    title = (
        f"{workload.name}: {counted(len(workload.requests), 'request')} over {settings['duration_s']:.0f} s, "
        f"{min_r}-{max_r} replicas × {cache} tokens, {service.service}, routing {args.policy}, "
        f"TTFT target {settings['target_ttft_ms']:g} ms, start-up {args.startup_delay_s:g} s"
    )
    print(format_table(title, metrics, details))
    if json_path:
        write_json(json_path, {"scenario": workload.name, "settings": settings, "scalers": metrics})
    if plot_path:
        with writing(plot_path, "--plot"):
            write_plot(str(plot_path), title, runs, target_s)
    sys.stdout.flush()
    return 0
