"""`prefixfleet sim`: compare routing policies on a workload, or reproduce the seed lab's table."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prefixfleet.cli import UsageError, counted
from prefixfleet.outputs import distinct_outputs, output_file, write_json, writing
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES, make_policy
from prefixfleet.sglang_fields import lax_bool

from .engine import SERVICE_MODELS, FieldRuleError, ServiceConfig, field_floor
from .lab import reproduce_lab
from .report import format_table, summarize, write_plot
from .simulator import FleetConfig, RunResult, simulate, simulate_ideal
from .workloads import (
    WORKLOADS,
    Workload,
    WorkloadRequest,
    build_workload,
    count_refusal,
    input_files,
    settings_help,
    whole_number,
)

SERVICE_KEYS = {f for f in ServiceConfig.__dataclass_fields__ if f != "service"}
# --policies and --seed default to None so that `--reproduce` can refuse them whenever they are given
# (comparing with the default would wave `--seed 0` through); these apply after parsing.
DEFAULT_POLICIES = "all"
DEFAULT_SEED = 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulate a fleet: compare routing policies on a workload",
        description=(
            "Discrete-event fleet simulation running the real routing policies. With only --workload, "
            "the workload runs at its acceptance settings; flags override them."
        ),
    )
    p.add_argument("--workload", metavar="W", help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--reproduce", choices=["lab"], help="reproduce a published comparison instead")
    p.add_argument("--policies", help=f"'all' or a comma-separated list (default: {DEFAULT_POLICIES})")
    p.add_argument("--replicas", type=int, help="number of replicas (default: the workload's)")
    p.add_argument("--cache-tokens", type=int, help="radix cache capacity per replica in tokens")
    p.add_argument("--seed", type=int, help=f"workload seed (default: {DEFAULT_SEED})")
    add_service_arguments(p, "the workload's")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="workload_settings",
        metavar="KEY=VALUE",
        help=settings_help(
            "workload",
            {
                "prefixroute": "num_requests=500, tenants=24",
                "trace:PATH": "limit=1000, speedup=2, block_tokens=32",
            },
        ),
    )
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write the TTFT CDF and hit-rate chart")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bars")
    p.set_defaults(func=run)


def add_service_arguments(p: argparse.ArgumentParser, default: str) -> None:
    """``--service`` and repeatable ``--engine KEY=VALUE`` (read back by :func:`service_config`)."""
    p.add_argument("--service", choices=SERVICE_MODELS, help=f"service model (default: {default})")
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"service-model parameter, repeatable ({', '.join(sorted(SERVICE_KEYS))})",
    )


def service_config(base: dict[str, Any], args: argparse.Namespace) -> ServiceConfig:
    """``base`` (a workload's or scenario's recommendation) overridden by ``--service``/``--engine``."""
    values = {k: v for k, v in base.items() if k in SERVICE_KEYS or k == "service"}
    if args.service:
        values["service"] = args.service
    typed = parse_pairs(args.engine, "--engine")  # as written, to quote in ServiceConfig's refusals
    for key, value in typed.items():
        if key not in SERVICE_KEYS:
            raise UsageError(
                f"unknown --engine parameter {key!r}; choose from {', '.join(sorted(SERVICE_KEYS))}"
            )
        field_type = type(ServiceConfig.__dataclass_fields__[key].default)
        if field_type is bool:  # bool("false") is True: read it as the engines' JSON fields are
            flag = lax_bool(value)
            if flag is None:
                raise UsageError(f"--engine {key} must be true or false, got {value!r}")
            values[key] = flag
            continue
        if field_type is int:  # a count (max_running, step_token_budget): 1e3 is one, 2.5 is not
            count = whole_number(value)
            if count is None:
                raise UsageError(f"--engine {key} {count_refusal(value, floor=field_floor(key))}")
            values[key] = count
            continue
        try:
            values[key] = field_type(value)
        except ValueError:
            raise UsageError(f"--engine {key} must be a number, got {value!r}") from None
        if not math.isfinite(values[key]):  # nan times never compare: the event loop starved
            raise UsageError(f"--engine {key} must be a finite number, got {value!r}")
    try:
        return ServiceConfig(**values)
    except FieldRuleError as exc:
        # ServiceConfig's rule in its own words; the flag and the text typed added here (its own
        # line said "got 0" of '0e0'). A field not typed came from the workload's recommendation.
        if exc.field in typed:
            raise UsageError(f"--engine {exc.field} {exc.rule}, got {typed[exc.field]!r}") from None
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` flags (``--set``, ``--engine``) as a dict; dashes in keys become underscores."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{what} {item!r} must look like KEY=VALUE")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def parse_settings(items: list[str], kind: str = "workload") -> dict[str, str]:
    """``--set KEY=VALUE`` flags (a workload's or scenario's settings) as a dict. The seed is a flag
    of its own: passed to the builder beside the settings, ``--set seed=3`` was a TypeError."""
    settings = parse_pairs(items, "--set")
    if "seed" in settings:
        raise UsageError(f"--set seed={settings['seed']}: the seed is no {kind} setting; use --seed")
    return settings


def parse_names(
    spec: str, known: Sequence[str], flag: str, what: str, aliases: Mapping[str, str] | None = None
) -> list[str]:
    """``all`` or a comma-separated list of names from ``known`` or ``aliases`` (an alias stands for
    the name it maps to; duplicates dropped, order kept)."""
    aliases = aliases or {}
    if spec.strip() == "all":
        return list(known)
    names = [aliases.get(n.strip(), n.strip()) for n in spec.split(",") if n.strip()]
    choices = ", ".join([*aliases, *known])
    if not names:
        raise UsageError(f"{flag} is empty; use 'all' or a comma-separated list of {choices}")
    for name in names:
        if name not in known:
            raise UsageError(f"unknown {what} {name!r}; choose from {choices} or 'all'")
    return list(dict.fromkeys(names))


def policy_names(spec: str, flag: str = "--policies") -> tuple[str, ...]:
    """Routing policies for ``flag``: ``default`` (the project default), ``all`` or a comma list."""
    return tuple(parse_names(spec, list(POLICIES), flag, "policy", aliases={"default": DEFAULT_POLICY}))


def _fleet(args: argparse.Namespace, workload: Workload) -> FleetConfig:
    rec = dict(workload.recommended)
    replicas = args.replicas if args.replicas is not None else rec.pop("replicas", 4)
    cache = args.cache_tokens if args.cache_tokens is not None else rec.pop("cache_tokens", 4000)
    rec.pop("replicas", None)
    rec.pop("cache_tokens", None)
    if replicas <= 0:
        raise UsageError(f"--replicas must be positive, got {replicas}")
    if cache <= 0:
        raise UsageError(f"--cache-tokens must be positive, got {cache}")
    return FleetConfig(replicas, cache, service_config(rec, args))


def check_kv_pool(requests: Sequence[WorkloadRequest], cache_tokens: int, service: ServiceConfig) -> None:
    """An emulated engine refuses a request its KV pool cannot hold (prompt + output tokens): refuse
    the run before it starts, not with a traceback at the first such request part-way through."""
    if service.service != "emulator" or not requests:
        return
    # a Job generates at least one token (sim/engine.py), so the pool must hold that one too
    needs = [r.num_tokens + max(1, r.output_tokens) for r in requests]
    need = max(needs)
    if need > cache_tokens:
        index = needs.index(need)
        raise UsageError(
            f"a {cache_tokens}-token cache (--cache-tokens) is too small for the emulator service model: "
            f"request #{index} needs {need} tokens ({requests[index].num_tokens} prompt + "
            f"{need - requests[index].num_tokens} output), and an emulated engine refuses a request its "
            "KV pool cannot hold"
        )


def run_reproduce(args: argparse.Namespace) -> int:
    json_path = output_file(args.json, "--json")
    report = reproduce_lab()
    lines = [
        "seed lab burst (4 replicas, 9216-token caches, prefill 0.025 ms/token, lookup 0.0015 ms/token, "
        "queue drains 14 ms per arrival)",
        f"{'policy':<16}{'hit ratio':>10}{'mean ms':>10}{'max ms':>10}{'max reqs':>10}{'evicted':>10}",
    ]
    for name, m in report["policies"].items():
        lines.append(
            f"{name:<16}{m['cache_hit_ratio']:>10.4f}{m['mean_ttft_ms']:>10.2f}{m['max_ttft_ms']:>10.2f}"
            f"{m['max_replica_requests']:>10}{m['total_evicted_tokens']:>10}"
        )
    print("\n".join(lines))
    if json_path:
        write_json(json_path, report)
    return 0


def _workload_flags(args: argparse.Namespace) -> dict[str, bool]:
    """Which flags that shape a --workload run were given (``--reproduce`` takes none of them)."""
    return {
        "--policies": args.policies is not None,
        "--replicas": args.replicas is not None,
        "--cache-tokens": args.cache_tokens is not None,
        "--seed": args.seed is not None,
        "--service": args.service is not None,
        "--engine": bool(args.engine),
        "--set": bool(args.workload_settings),
        "--plot": args.plot is not None,
    }


def run(args: argparse.Namespace) -> int:
    if args.reproduce:
        if args.workload:
            raise UsageError("use either --workload or --reproduce, not both")
        ignored = [flag for flag, given in _workload_flags(args).items() if given]
        if ignored:  # the published settings are fixed: a flag that changes nothing is refused
            raise UsageError(
                f"--reproduce {args.reproduce} runs the published settings; drop {', '.join(ignored)}"
            )
        return run_reproduce(args)
    if not args.workload:
        raise UsageError(f"--workload is required (one of: {', '.join(WORKLOADS)}) unless --reproduce lab")
    names = policy_names(DEFAULT_POLICIES if args.policies is None else args.policies)
    seed = DEFAULT_SEED if args.seed is None else args.seed
    json_path = output_file(args.json, "--json", inputs=input_files(args.workload))
    plot_path = output_file(args.plot, "--plot", suffix=".png", inputs=input_files(args.workload))
    distinct_outputs({"--json": json_path, "--plot": plot_path}, {})
    settings = parse_settings(args.workload_settings)
    try:
        workload = build_workload(args.workload, seed=seed, **settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not workload.requests:
        raise UsageError(f"workload {workload.name!r} has no requests with these settings")
    fleet = _fleet(args, workload)
    check_kv_pool(workload.requests, fleet.cache_tokens, fleet.service)
    cost = fleet.service.cost
    runs: list[RunResult] = []
    metrics: dict[str, dict[str, Any]] = {}
    for name in names:
        started = time.perf_counter()
        run_result = simulate(workload.requests, make_policy(name, cost), fleet, progress=args.progress)
        metrics[name] = summarize(run_result)
        metrics[name]["sim_seconds"] = round(time.perf_counter() - started, 3)
        runs.append(run_result)
    ideal = simulate_ideal(workload.requests, fleet)
    metrics["ideal"] = summarize(ideal)
    runs.append(ideal)
    unique_tokens = metrics["ideal"]["prefill_tokens"]
    settings = {
        "seed": seed,
        "replicas": fleet.replicas,
        "cache_tokens": fleet.cache_tokens,
        **fleet.service.as_dict(),
        "requests": len(workload.requests),
        "prompt_tokens": workload.total_prompt_tokens,
        "distinct_prompt_tokens": unique_tokens,
        "working_set_over_one_cache": round(unique_tokens / fleet.cache_tokens, 2),
        "duration_s": round(workload.requests[-1].arrival_s, 3) if workload.requests else 0.0,
        "workload": workload.settings,
        "ideal": "policies.ideal: no waiting, fleet-wide infinite cache (a bound no policy can beat)",
    }
    title = (
        f"{workload.name}: {counted(len(workload.requests), 'request')}, "
        f"{counted(fleet.replicas, 'replica')} × "
        f"{fleet.cache_tokens} cache tokens, service {fleet.service.service}"
    )
    print(format_table(title, metrics, DEFAULT_POLICY))
    if json_path:
        write_json(
            json_path,
            {
                "workload": workload.name,
                "settings": settings,
                "default_policy": DEFAULT_POLICY,
                "policies": metrics,
            },
        )
    if plot_path:
        with writing(plot_path, "--plot"):
            write_plot(str(plot_path), title, runs, metrics, DEFAULT_POLICY)
    sys.stdout.flush()
    return 0
