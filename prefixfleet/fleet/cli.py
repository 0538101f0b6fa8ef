"""`prefixfleet up`, `prefixfleet load` and `prefixfleet compare`: the local fleet from the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefixfleet.cli import DefaultsHelpFormatter, UsageError, check_positive, counted
from prefixfleet.emulator.cli import PREFILL_RATE_RANGE, TIME_SCALE_RANGE, check_range
from prefixfleet.outputs import distinct_outputs, output_dir, output_file, write_json, writing
from prefixfleet.router.policies import DEFAULT_POLICY

if TYPE_CHECKING:
    from prefixfleet.fleet.load import LoadSummary
    from prefixfleet.fleet.processes import ChildFailedError

DEFAULT_UP_WORKLOAD = "prefixroute"
MAX_LATENCY_PROBES = 1_000_000  # compare's added-latency probe: a local fleet serves hundreds per second
# A live replay runs on the wall clock: one longer than a week (a trace spanning 1e300 ms, a speedup
# of 1e-300) is a mistake, not a soak test, and would hold the terminal until Ctrl-C.
MAX_REPLAY_S = 7 * 24 * 3600
REPLAY_CAP_HELP = "a replay longer than 7 days of wall clock is refused"
# the emulator's own bounds on the engine flags passed through to it (prefixfleet.emulator.cli)
ENGINE_SPEED_HELP = (
    f"{TIME_SCALE_RANGE[0]:g} to {TIME_SCALE_RANGE[1]:g}, as the emulator takes; {REPLAY_CAP_HELP}"
)
PREFILL_HELP = f"per engine (default: the workload's); {PREFILL_RATE_RANGE[0]:g} to {PREFILL_RATE_RANGE[1]:g}"
DEFAULT_UP_POLICIES = "default,round_robin"
# `up --autoscale`'s flags default to None so that giving one without --autoscale is refused whatever
# its value (comparing with the default would wave `--min-replicas 1` through); these apply after.
DEFAULT_MIN_REPLICAS = 1
DEFAULT_AUTOSCALE_INTERVAL_S = 2.0
# Defaults of `compare`, kept here so that registering the CLI imports nothing heavy.
COMPARE_DEFAULTS: dict[str, Any] = {
    "requests": 600,
    "replicas": 4,
    "block_tokens": 16,
    "time_scale": 4.0,
    "max_output_tokens": 4,
    "latency_rate_rps": 100.0,
    "latency_seconds": 5.0,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_up(subparsers)
    _register_load(subparsers)
    _register_compare(subparsers)


# -- argument helpers --------------------------------------------------------------------------------


def add_settings_argument(p: argparse.ArgumentParser, examples: dict[str, str]) -> None:
    """``--set KEY=VALUE``, its help naming where the keys are and the caps (imported here: registering
    the CLI imports nothing heavy)."""
    from prefixfleet.sim.workloads import settings_help

    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help=settings_help("workload", examples)
    )


def input_files(spec: str) -> list[str]:
    """The files ``spec`` reads (imported here: registering the CLI imports nothing heavy)."""
    from prefixfleet.sim.workloads import input_files as read_by

    return read_by(spec)


def _workload(spec: str, requests: int, seed: int, overrides: dict[str, Any]) -> Any:
    from prefixfleet.fleet.sampling import build_scaled_workload

    try:
        workload = build_scaled_workload(spec, requests, seed=seed, **overrides)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not workload.requests:
        raise UsageError(f"workload {spec!r} has no requests")
    return workload


def check_engine_speed(time_scale: float, prefill_tokens_per_s: float | None) -> None:
    """The engine flags ``up`` and ``compare`` pass to every emulator child, within the bounds the
    emulator itself takes (one definition, prefixfleet.emulator.cli): out of them the child would
    refuse to start; here the user gets the one line before anything starts."""
    check_range("--time-scale", time_scale, TIME_SCALE_RANGE)
    if prefill_tokens_per_s is not None:
        check_range("--prefill-tokens-per-s", prefill_tokens_per_s, PREFILL_RATE_RANGE)


def check_derived_prefill_rate(rate: float | None, given: float | None) -> None:
    """A prefill rate derived from the workload (``given`` None) must also be one the emulator takes."""
    least, most = PREFILL_RATE_RANGE
    if given is None and rate is not None and not least <= rate <= most:
        raise UsageError(
            f"the workload's prefill rate per engine is {rate:g} tokens/s, outside the emulator's"
            f" {least:g} to {most:g}; give --prefill-tokens-per-s"
        )


def _check_cache_fits(requests: list[Any], cache_tokens: int | None) -> None:
    """An explicit ``--cache-tokens`` holds the longest of the ``requests`` replayed (prompt and its
    capped output: ``workload_slice``), or the engines refuse it: a run whose every answer is an
    error, exit 0, with --cache-tokens 2."""
    if cache_tokens is None:
        return
    need = max(r.num_tokens + r.output_tokens for r in requests)
    if cache_tokens < need:
        raise UsageError(
            f"--cache-tokens {cache_tokens} cannot hold the workload's longest request ({need} tokens with "
            f"its output); give at least {need} or leave it out"
        )


def _check_replay_length(requests: list[Any], speedup: float, flag: str) -> None:
    """The wall clock a replay of ``requests`` at ``speedup`` takes must be at most MAX_REPLAY_S."""
    if not requests:
        return
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals)  # the replay starts at the first arrival
    wall_s = span / speedup
    if not wall_s <= MAX_REPLAY_S:
        # a speedup of 1e-320 overflows the division: "would take inf s" named no time
        took = f"{wall_s:.3g} s of wall clock" if math.isfinite(wall_s) else "too long to count"
        raise UsageError(
            f"the replay would take {took} ({span:.3g} s of arrivals at "
            f"{flag} {speedup:g}); at most {MAX_REPLAY_S:,} s (7 days): raise {flag} or replay fewer requests"
        )


def _progress_default(value: bool | None) -> bool:
    return sys.stderr.isatty() if value is None else value


def run_fleet_main(main: Any, command: str, *, starts_processes: bool = True) -> Any:
    """Run the fleet coroutine; turn child failures into the CLI's one-line error ("prefixfleet up:
    error: ...", as prefixfleet.cli.main words a UsageError), with the log's last lines after it,
    instead of a traceback. Exit status 1: the input was fine, the fleet was not.
    ``starts_processes``: False for a command that starts none (``load``), whose SIGTERM line then
    does not claim to have stopped any."""
    from prefixfleet.fleet import processes

    try:
        return processes.run_until_signalled(main)
    except asyncio.CancelledError:
        stopped = "; every process it started was stopped" if starts_processes else ""
        print(f"{command}: stopped by SIGTERM{stopped}", file=sys.stderr)
        raise SystemExit(143) from None
    except processes.ChildFailedError as exc:
        print(fleet_failure(command, exc), file=sys.stderr)
        raise SystemExit(1) from None


@contextlib.contextmanager
def claimed(run_dir: Path | None) -> Iterator[None]:
    """The run's ``--run-dir`` held for the run (:func:`~prefixfleet.fleet.processes.claim_run_dir`):
    a second ``up``, ``compare`` or ``chaos`` run there at the same time is refused in one line."""
    from prefixfleet.fleet.processes import RunDirInUse, claim_run_dir

    if run_dir is None:
        yield
        return
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(claim_run_dir(run_dir))
        except RunDirInUse as exc:
            raise UsageError(f"--run-dir {exc}; give this run its own --run-dir") from None
        except OSError as exc:
            # its lock file cannot be opened (root's, left by a sudo run; a directory there): the
            # checks before the run ask only whether the directory can be made and written. Only
            # taking the lock is guarded: an OSError of the run itself is the run's.
            where = f"{exc.filename}: " if exc.filename else ""
            raise UsageError(f"--run-dir {run_dir}: cannot use it ({where}{exc.strerror or exc})") from None
        yield


def fleet_failure(command: str, exc: ChildFailedError) -> str:
    """The error line naming the failed process and where its log is, then the log's last lines."""
    line = f"{command}: error: fleet process {exc.name}: {exc.message}"
    if exc.log_path is not None:
        line += f" (log: {exc.log_path})"
    return line + exc.tail_block()


# -- up ----------------------------------------------------------------------------------------------


def _register_up(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "up",
        help="run a local fleet (Valkey, emulated engines + sidecars, gateways) and benchmark policies",
        description=(
            "Starts an embedded Redis-compatible server, N engine emulators each behind its sidecar and "
            "M gateways on 127.0.0.1, replays a workload through the gateways once per routing policy "
            "(caches flushed between policies), prints TTFT/hit-rate per policy, runs the simulator on "
            "the same requests and reports whether both rank the policies alike, and stops everything."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--replicas", type=int, default=4, help="engines (each with a sidecar)")
    p.add_argument("--gateways", type=int, default=2, help="gateway replicas (requests alternate)")
    p.add_argument(
        "--engine-api",
        choices=["sglang", "vllm"],
        default="sglang",
        help="the API the emulated engines speak: SGLang's, or vLLM's (emulator --api vllm, sidecars"
        " --engine-api vllm; --cache-tokens then a multiple of vLLM's block size, 16)",
    )
    p.add_argument(
        "--workload", default=DEFAULT_UP_WORKLOAD, help="prefixroute, lab-burst, gsp, chat, viral, trace:PATH"
    )
    add_settings_argument(p, {DEFAULT_UP_WORKLOAD: "tenants=24, rate_rps=40"})
    p.add_argument(
        "--policies", default=DEFAULT_UP_POLICIES, help="'default', 'all' or a comma list of policy names"
    )
    p.add_argument("--requests", type=int, default=600, help="requests per policy (0: the whole workload)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.5,
        help="engine speed-up; the workload is replayed at the same factor (0.5: twice as slow as modelled;"
        f" {ENGINE_SPEED_HELP})",
    )
    p.add_argument("--cache-tokens", type=int, default=None, help="per engine (default: the workload's)")
    p.add_argument("--prefill-tokens-per-s", type=float, default=None, help=PREFILL_HELP)
    p.add_argument("--max-output-tokens", type=int, default=4, help="cap on generated tokens per request")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write the TTFT CDF and hit-rate chart")
    p.add_argument("--run-dir", default="out/fleet-run", help="process logs go here")
    p.add_argument(
        "--sim-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also simulate the same requests and compare the policy rankings",
    )
    p.add_argument(
        "--keep-running", action="store_true", help="after the runs, keep the fleet up until Ctrl-C"
    )
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="after the runs, keep the fleet up (as --keep-running) with the prefix-aware autoscaler "
        "adding pre-warmed replicas and removing the least valuable one (docs/autoscaling-operator.md)",
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        default=None,
        help=f"with --autoscale: lower bound (default: {DEFAULT_MIN_REPLICAS})",
    )
    p.add_argument(
        "--max-replicas", type=int, default=None, help="with --autoscale: upper bound (default 2×)"
    )
    p.add_argument(
        "--autoscale-interval",
        type=float,
        default=None,
        help=f"with --autoscale: seconds per round (default: {DEFAULT_AUTOSCALE_INTERVAL_S:g})",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="with --autoscale: read engine rates from this Prometheus (scraping the fleet with the labels"
        " of prefixfleet.observability.local_prometheus), or 'local' to start one that follows the fleet;"
        " the sidecars' /metrics when it fails",
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bars")
    p.set_defaults(func=run_up_command)


def run_up_command(args: argparse.Namespace) -> int:
    from prefixfleet.fleet.local import FleetSpec, UpOptions, engine_for_workload, up_sim, workload_slice
    from prefixfleet.sim.cli import parse_settings, policy_names

    policies = policy_names(args.policies)
    if args.requests < 0:
        raise UsageError(f"--requests must be >= 0, got {args.requests}")
    check_engine_speed(args.time_scale, args.prefill_tokens_per_s)
    check_positive("--cache-tokens", args.cache_tokens, allow_none=True)
    check_positive("--max-output-tokens", args.max_output_tokens)
    json_path = output_file(args.json, "--json", inputs=input_files(args.workload))
    plot_path = output_file(args.plot, "--plot", suffix=".png", inputs=input_files(args.workload))
    run_dir = output_dir(args.run_dir, "--run-dir")
    distinct_outputs({"--json": json_path, "--plot": plot_path}, {"--run-dir": run_dir})
    workload = _workload(args.workload, args.requests, args.seed, parse_settings(args.set))
    # the requests run_up replays: a small --requests may need less room than the whole workload
    replayed = workload_slice(workload, args.requests, args.max_output_tokens)
    _check_cache_fits(replayed, args.cache_tokens)
    _check_replay_length(replayed, args.time_scale, "--time-scale")
    engine = engine_for_workload(
        workload,
        max(args.replicas, 1),
        time_scale=args.time_scale,
        cache_tokens=args.cache_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        output_tokens=args.max_output_tokens,
        api=args.engine_api,
    )
    check_derived_prefill_rate(engine.prefill_tokens_per_s, args.prefill_tokens_per_s)
    spec = FleetSpec(replicas=args.replicas, gateways=args.gateways, engine=engine)
    problems = spec.problems()
    if problems:
        raise UsageError("; ".join(problems))
    options = UpOptions(
        policies=policies,
        requests=args.requests,
        max_output_tokens=args.max_output_tokens,
        run_dir=run_dir,
        progress=_progress_default(args.progress),
        sim_check=args.sim_check,
        restart_dead_replicas=not args.autoscale,  # with it, the planner replaces a dead replica
    )
    scaling = _autoscale_policy(args)

    def write_results(report: dict[str, Any], runs: list[Any]) -> None:
        # called before --keep-running/--autoscale hold the fleet, which only Ctrl-C ends
        if json_path:
            write_json(json_path, report)
        if plot_path:
            from prefixfleet.fleet.load import ttfts_ms
            from prefixfleet.fleet.plots import write_live_plot

            with writing(plot_path, "--plot"):
                write_live_plot(
                    plot_path,
                    f"prefixfleet up: {workload.name}, {counted(spec.replicas, 'engine')}, "
                    f"{counted(spec.gateways, 'gateway')}",
                    {r.policy: ttfts_ms(r.run.outcomes) for r in runs},
                    {r.policy: r.run.summary.hit_rate for r in runs},
                )

    keep_running = args.keep_running or scaling is not None
    with claimed(run_dir):
        sim = up_sim(workload, spec, options)  # before the event loop: a Ctrl-C stops it at once
        report, _ = run_fleet_main(
            lambda: _up_main(workload, spec, options, keep_running, scaling, write_results, sim),
            "prefixfleet up",
        )
    print(format_up(report))
    return 0


def _autoscale_policy(args: argparse.Namespace) -> tuple[Any, float, str | None] | None:
    """The planner's policy, round interval and Prometheus for ``--autoscale`` (None without it)."""
    if not args.autoscale:
        if args.prometheus is not None:
            raise UsageError("--prometheus needs --autoscale (it is where the autoscaler reads engine rates)")
        given = {
            "--min-replicas": args.min_replicas,
            "--max-replicas": args.max_replicas,
            "--autoscale-interval": args.autoscale_interval,
        }
        ignored = [flag for flag, value in given.items() if value is not None]
        if ignored:  # they would change nothing: say so rather than run without them
            raise UsageError(f"{', '.join(ignored)} {'needs' if len(ignored) == 1 else 'need'} --autoscale")
        return None
    from prefixfleet.operator.autoscale import ScalePolicy

    minimum = DEFAULT_MIN_REPLICAS if args.min_replicas is None else args.min_replicas
    interval_s = DEFAULT_AUTOSCALE_INTERVAL_S if args.autoscale_interval is None else args.autoscale_interval
    check_positive("--autoscale-interval", interval_s)
    maximum = args.max_replicas if args.max_replicas is not None else max(2 * args.replicas, 2)
    if not 1 <= minimum <= args.replicas <= maximum:
        raise UsageError(
            f"--autoscale needs 1 <= --min-replicas ({minimum}) <= --replicas ({args.replicas})"
            f" <= --max-replicas ({maximum})"
        )
    if args.prometheus is not None:
        from prefixfleet.operator.models import PROMETHEUS_URL_PATTERN

        if args.prometheus != "local" and not re.fullmatch(PROMETHEUS_URL_PATTERN, args.prometheus):
            raise UsageError(
                "--prometheus must be an http(s)://HOST[:PORT][/PATH] URL or 'local',"
                f" got {args.prometheus!r}"
            )
        if args.prometheus == "local":  # it starts after the benchmark: a missing binary said now
            from prefixfleet.observability.local_prometheus import PrometheusNotFound, prometheus_binary

            try:
                prometheus_binary()
            except PrometheusNotFound as exc:
                raise UsageError(f"--prometheus local: {exc}") from None
    from prefixfleet.sim.scenarios import SCENARIO_FLEET

    # A local fleet runs for minutes, not days: its timers are compressed as the scenarios' are
    # (the operator's defaults, 60 s and 300 s, would hold every replica through a whole session).
    policy = ScalePolicy(
        min_replicas=minimum,
        max_replicas=maximum,
        scale_up_cooldown_s=SCENARIO_FLEET["scale_up_cooldown_s"],
        scale_down_stabilization_s=SCENARIO_FLEET["scale_down_stabilization_s"],
    )
    return policy, interval_s, args.prometheus


async def _up_main(
    workload: Any,
    spec: Any,
    options: Any,
    keep_running: bool,
    scaling: tuple[Any, float, str | None] | None = None,
    on_results: Any = None,
    sim: Any = None,
) -> Any:
    from prefixfleet.fleet.local import LocalFleet, run_up

    async def hold(fleet: LocalFleet, report: dict[str, Any]) -> None:
        policy = options.policies[0]
        await fleet.reset()
        await fleet.start_gateways(policy)
        print(format_up(report), flush=True)
        print(
            f"fleet running with policy {policy}: gateways {' '.join(fleet.gateway_urls)}; "
            f"redis {fleet.redis_url}; logs in {options.run_dir}. Ctrl-C stops everything.",
            flush=True,
        )
        if scaling is not None:
            await _hold_autoscaled(fleet, *scaling)
        while True:  # until Ctrl-C / SIGTERM cancels us; a dead child ends it too
            await asyncio.sleep(1.0)
            fleet.sup.check_alive()

    return await run_up(workload, spec, options, hold if keep_running else None, on_results, sim)


async def _hold_autoscaled(fleet: Any, policy: Any, interval_s: float, prometheus: str | None = None) -> None:
    """Run the autoscaler until cancelled, printing each decision it executes."""
    from prefixfleet.fleet.autoscale import FleetPrometheus, LocalAutoscaler
    from prefixfleet.fleet.processes import ChildFailedError, free_port

    local = None
    if prometheus == "local":  # a Prometheus of our own whose targets follow the fleet
        local = FleetPrometheus(fleet, fleet.sup.run_dir / "prometheus", free_port())
        try:
            await local.start()
        except RuntimeError as exc:  # it exited or never became ready: the CLI's one-line error
            first, _, log = str(exc).partition("\n")
            raise ChildFailedError("prometheus", first.rstrip(":"), log.strip()) from None
        prometheus = local.url
        print(f"prometheus on {prometheus} (scraping the fleet every second)", flush=True)
    autoscaler = LocalAutoscaler(fleet, policy, interval_s=interval_s, prometheus_url=prometheus)
    bounds = f"{policy.min_replicas}..{policy.max_replicas}"
    print(f"autoscaler on: {bounds} replicas, a round every {interval_s:g}s", flush=True)
    task = asyncio.create_task(autoscaler.run())
    shown = 0
    unfollowed = False
    try:
        while True:
            await asyncio.sleep(1.0)
            fleet.sup.check_alive()
            if local is not None:
                unfollowed = await follow_fleet(local, unfollowed)
            for event in autoscaler.events[shown:]:
                print(f"autoscaler {event.action}: {event.detail}", flush=True)
            shown = len(autoscaler.events)
            if task.done():
                task.result()  # a crashed loop is an error, not a silent stop
    finally:
        from prefixfleet.cancellation import cancel_and_wait

        await cancel_and_wait([task])  # its start/drain tasks end before the fleet is torn down
        if local is not None:
            await local.stop()


async def follow_fleet(local: Any, failing: bool) -> bool:
    """Have the local Prometheus follow the fleet's processes; whether it fails to now. A dead or
    refusing Prometheus is said once when it starts failing and once when it follows again: the
    autoscaler reads the sidecars' /metrics meanwhile, so it does not end the fleet (it did, with a
    traceback, at the first scale-down after Prometheus died)."""
    import httpx

    try:
        await local.follow()
    except (httpx.HTTPError, RuntimeError, OSError) as exc:
        if not failing:
            why = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
            print(
                f"prometheus {local.url} cannot follow the fleet ({why}); the autoscaler reads the"
                " sidecars' /metrics for the replicas it does not scrape",
                flush=True,
            )
        return True
    if failing:
        print(f"prometheus {local.url} follows the fleet again", flush=True)
    return False


def format_up(report: dict[str, Any]) -> str:
    from prefixfleet.fleet.load import format_table

    s = report["settings"]
    engine = s["engine"]
    engines = counted(s["replicas"], "vLLM-API engine" if engine.get("api") == "vllm" else "engine")
    title = (
        f"{report['workload']}: {counted(s['requests'], 'request')}, {engines} × "
        f"{engine['cache_tokens']} cache tokens, {counted(s['gateways'], 'gateway')}, "
        f"time-scale {engine['time_scale']} "
        "(TTFT wall-clock ms)"
    )
    rows = {(f"{n}*" if n == DEFAULT_POLICY else n): r for n, r in report["policies"].items()}
    lines = [title, format_table(rows)]
    sim = report.get("sim")
    if sim and sim.get("agreement"):
        a = sim["agreement"]
        lines.append(f"ranking by mean TTFT  live: {' < '.join(a['live_order'])}")
        lines.append(f"                      sim:  {' < '.join(a['sim_order'])}")
        lines.append(
            f"Kendall tau {a['kendall_tau']:.2f}; same order: {a['same_order']}; same best: {a['same_best']}"
        )
    resolved = (sim or {}).get("resolved_agreement")
    if resolved:
        lines.append("resolvable ranking (= : within noise)")
        for label in ("live", "sim"):
            tiers = " < ".join(" = ".join(t) for t in resolved[f"{label}_tiers"])
            lines.append(f"  {label:<4} {tiers}")
        lines.append(
            f"pairs ordered alike: {len(resolved['confirmed_pairs'])}, contradicting: "
            f"{len(resolved['contradicting_pairs'])}, unresolved in one: {len(resolved['unresolved_pairs'])}"
            f" -> {'agree' if resolved['agree'] else 'DISAGREE'}"
        )
    return "\n".join(lines)


# -- load --------------------------------------------------------------------------------------------

# A script (CI, a smoke test after a deploy) runs `load` to learn whether the endpoint served: a wrong
# port or a failing fleet must not pass. One failed request fails the run; the figures of the
# requests that did succeed are printed and written all the same.
LOAD_EXIT_STATUS = (
    "Exit status: 0 when every request succeeded, 1 when any failed (the summary and --json are"
    " written either way), 2 for a bad flag."
)


def _register_load(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "load",
        help="replay a workload open-loop against any OpenAI/SGLang-compatible endpoint",
        description="Replay a workload open-loop against any OpenAI/SGLang-compatible endpoint and print"
        " TTFT, hit rate and throughput.",
        epilog=LOAD_EXIT_STATUS,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--target", action="append", required=True, metavar="URL", help="repeatable: requests alternate"
    )
    p.add_argument("--workload", required=True, help="prefixroute, lab-burst, gsp, chat, viral, trace:PATH")
    add_settings_argument(
        p, {"prefixroute": "tenants=24, rate_rps=40", "trace:PATH": "limit=1000, block_tokens=64"}
    )
    p.add_argument(
        "--api", choices=["openai", "sglang"], default="openai", help="/v1/completions or /generate"
    )
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True, help="SSE streaming")
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help=f"replay the arrival times this much faster ({REPLAY_CAP_HELP})",
    )
    p.add_argument("--limit", type=int, default=0, help="first N requests (traces: whole groups); 0 = all")
    p.add_argument("--max-output-tokens", type=int, default=None, help="cap on generated tokens per request")
    p.add_argument("--concurrency", type=int, default=512, help="client-side cap on requests in flight")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    p.add_argument("--model", default=None, help="model field (default: the target's first /v1/models id)")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--json", metavar="FILE", help="write the summary as JSON")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.set_defaults(func=run_load_command)


def run_load_command(args: argparse.Namespace) -> int:
    from prefixfleet.fleet.load import format_table, requests_from_workload, run_load
    from prefixfleet.router.cli import check_http_url
    from prefixfleet.sim.cli import parse_settings

    for url in args.target:
        check_http_url("--target", url)
    if args.model is not None and not args.model.strip():
        raise UsageError("--model is empty; leave it out to use the target's first /v1/models id")
    check_positive("--speedup", args.speedup)
    check_positive("--concurrency", args.concurrency)
    check_positive("--timeout", args.timeout)
    check_positive("--max-output-tokens", args.max_output_tokens, allow_none=True)
    if args.limit < 0:
        raise UsageError(f"--limit must be >= 0, got {args.limit}")
    json_path = output_file(args.json, "--json", inputs=input_files(args.workload))
    workload = _workload(args.workload, args.limit, args.seed, parse_settings(args.set))
    requests = requests_from_workload(
        workload, limit=args.limit or None, max_output_tokens=args.max_output_tokens
    )
    _check_replay_length(requests, args.speedup, "--speedup")

    async def main() -> Any:
        return await run_load(
            requests,
            args.target,
            api=args.api,
            speedup=args.speedup,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            stream=args.stream,
            model=args.model,
            progress=_progress_default(args.progress),
            desc="load",
        )

    run = run_fleet_main(main, "prefixfleet load", starts_processes=False)
    summary = run.summary
    print(f"{workload.name}: {counted(summary.requests, 'request')} to {', '.join(args.target)} ({args.api})")
    print(format_table({"target": summary.to_dict()}, title=""))
    print(f"throughput {summary.throughput_rps:.1f} req/s over {summary.duration_s:.1f} s")
    if summary.error_kinds:
        print("errors: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.error_kinds.items())))
    if json_path:
        write_json(json_path, {"workload": workload.name, "targets": args.target, **summary.to_dict()})
    return load_exit_status(summary)


def load_exit_status(summary: LoadSummary) -> int:
    """1 when any request of the run failed (saying so on stderr), else 0 (LOAD_EXIT_STATUS)."""
    if not summary.errors:
        return 0
    failed = f"{summary.errors} of {counted(summary.requests, 'request')} failed"
    print(f"load: {failed} (exit status 1)", file=sys.stderr)
    return 1


# -- compare -----------------------------------------------------------------------------------------


def _register_compare(subparsers: argparse._SubParsersAction) -> None:
    d = argparse.Namespace(**COMPARE_DEFAULTS)
    p = subparsers.add_parser(
        "compare",
        help="same emulated fleet and workload through our gateway vs the real sglang-router",
        description=(
            "Runs one workload through (a) the prefixfleet gateway with the default policy, (b) the "
            "gateway with round_robin and (c) the real sglang-router (PyPI) with --policy cache_aware, "
            "pointed straight at the engines; flushes caches between runs; then measures the gateway's "
            "added latency against direct engine requests at the same rate."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--workload", default=None, help="default: the Mooncake synthetic trace (see --trace)")
    p.add_argument(
        "--trace", default=None, metavar="PATH", help="Mooncake-format trace for the default workload"
    )
    add_settings_argument(p, {"trace:PATH": "limit=1000, block_tokens=64"})
    p.add_argument("--requests", type=int, default=d.requests, help="requests (traces: whole prefix groups)")
    p.add_argument("--replicas", type=int, default=d.replicas, help="engines (each with a sidecar)")
    p.add_argument("--gateways", type=int, default=1, help="our gateway processes (sglang-router is one)")
    p.add_argument(
        "--repeats", type=int, default=1, help="rounds of the three routers, pooled (for noisy machines)"
    )
    p.add_argument(
        "--block-tokens",
        type=int,
        default=None,  # None: not given, so a non-trace workload can refuse it whatever its value
        help=f"trace tokens per hash id (default: {d.block_tokens})",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help=f"engine speed-up = replay speed-up ({ENGINE_SPEED_HELP})",
    )
    p.add_argument("--cache-tokens", type=int, default=None, help="per engine (default: the workload's)")
    p.add_argument("--prefill-tokens-per-s", type=float, default=None, help=PREFILL_HELP)
    p.add_argument(
        "--max-output-tokens",
        type=int,
        default=d.max_output_tokens,
        help="cap on generated tokens per request",
    )
    p.add_argument("--latency-rate", type=float, default=d.latency_rate_rps, help="req/s per path")
    p.add_argument(
        "--latency-seconds",
        type=float,
        default=d.latency_seconds,
        help="length of the added-latency measurement",
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON (required)")
    p.add_argument("--plot", metavar="FILE.png", help="write the TTFT CDF and hit-rate chart")
    p.add_argument("--run-dir", default="out/compare-run", help="process logs go here")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bars")
    p.set_defaults(func=run_compare_command)


def _compare_spec(workload: str | None, trace: str | None) -> str:
    """The workload ``compare`` replays: ``--workload``, else ``trace:`` the ``--trace`` path or the
    shipped Mooncake trace, named as the user types it (the shipped one as the docs do,
    ``trace:traces/mooncake_synthetic_trace.jsonl``, not by its absolute path), as every refusal
    and the report say it."""
    from prefixfleet.fleet.compare import default_trace_path, path_as_typed
    from prefixfleet.sim.workloads import trace_file_problem

    if workload is not None:
        if trace:
            raise UsageError("use --trace only with the default workload (or --workload trace:PATH)")
        return workload
    if trace:
        if (problem := trace_file_problem(Path(trace))) is not None:
            problem = "the trace was not found (no such file)" if problem == "not found" else problem
            raise UsageError(f"--trace {trace}: {problem}")
        return f"trace:{trace}"
    shipped = default_trace_path()
    if shipped is None:
        raise UsageError(
            "the Mooncake trace was not found (looked for traces/mooncake_synthetic_trace.jsonl"
            " in the repository); pass --trace PATH or --workload W"
        )
    return f"trace:{path_as_typed(shipped, Path.cwd())}"


def run_compare_command(args: argparse.Namespace) -> int:
    from prefixfleet.fleet.compare import CompareOptions, format_compare, run_compare
    from prefixfleet.fleet.local import engine_for_workload, workload_slice
    from prefixfleet.sim.cli import parse_settings

    for flag in ("requests", "replicas", "gateways", "repeats", "max_output_tokens"):
        check_positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    check_positive("--block-tokens", args.block_tokens, allow_none=True)
    for flag in ("latency_rate", "latency_seconds"):
        check_positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    check_engine_speed(args.time_scale, args.prefill_tokens_per_s)
    check_positive("--cache-tokens", args.cache_tokens, allow_none=True)
    probes = args.latency_rate * args.latency_seconds
    if probes > MAX_LATENCY_PROBES:  # the probe sends rate × seconds requests down each path, all of them
        many = f"{probes:.3g} requests" if math.isfinite(probes) else "too many requests to count"
        raise UsageError(
            f"--latency-rate × --latency-seconds is {many} per path; at most {MAX_LATENCY_PROBES:,}"
        )
    spec = _compare_spec(args.workload, args.trace)
    # the default trace is read too: '--json traces/mooncake_synthetic_trace.jsonl' replaced it
    sources = input_files(spec)
    json_path = output_file(args.json, "--json", inputs=sources)
    plot_path = output_file(args.plot, "--plot", suffix=".png", inputs=sources)
    run_dir = output_dir(args.run_dir, "--run-dir")
    distinct_outputs({"--json": json_path, "--plot": plot_path}, {"--run-dir": run_dir})
    overrides: dict[str, Any] = parse_settings(args.set)
    block_tokens = COMPARE_DEFAULTS["block_tokens"] if args.block_tokens is None else args.block_tokens
    if spec.startswith("trace:"):
        overrides.setdefault("block_tokens", block_tokens)
    elif args.block_tokens is not None:
        raise UsageError(f"--block-tokens applies to traces only, not to --workload {spec}")
    workload = _workload(spec, args.requests, args.seed, overrides)
    replayed = workload_slice(workload, 0, args.max_output_tokens)  # all of it
    _check_cache_fits(replayed, args.cache_tokens)
    _check_replay_length(replayed, args.time_scale, "--time-scale")
    if args.prefill_tokens_per_s is None:  # run_compare derives it as up does: refuse it here, not in a child
        derived = engine_for_workload(workload, args.replicas, time_scale=args.time_scale)
        check_derived_prefill_rate(derived.prefill_tokens_per_s, None)
    options = CompareOptions(
        requests=args.requests,
        replicas=args.replicas,
        gateways=args.gateways,
        repeats=args.repeats,
        block_tokens=block_tokens,
        time_scale=args.time_scale,
        cache_tokens=args.cache_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        max_output_tokens=args.max_output_tokens,
        latency_rate_rps=args.latency_rate,
        latency_seconds=args.latency_seconds,
        run_dir=run_dir,
        progress=_progress_default(args.progress),
    )
    with claimed(run_dir):
        report, ttfts = run_fleet_main(lambda: run_compare(workload, options), "prefixfleet compare")
    print(format_compare(report))
    assert json_path is not None  # required flag
    write_json(json_path, report)
    if plot_path:
        from prefixfleet.fleet.plots import write_live_plot

        hits = {name: r["hit_rate"] for name, r in report["routers"].items() if "hit_rate" in r}
        with writing(plot_path, "--plot"):
            write_live_plot(plot_path, f"prefixfleet compare: {report['workload']}", ttfts, hits)
    return 0
