"""`prefixfleet router sidecar|gateway`: run the data-plane services."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from prefixfleet.cli import DefaultsHelpFormatter, UsageError, check_positive, listen_error

from .addresses import authority_error, bracket_ipv6_url, redis_url_error, without_userinfo
from .blockhash import DEFAULT_BLOCK_TOKENS
from .engine_api import AUTO, ENGINE_APIS
from .exemplars import DEFAULT_EXEMPLAR_BYTES
from .keys import DEFAULT_FLEET, validate_fleet_name
from .loadtrack import DEFAULT_PREFILL_TOKENS_PER_S
from .records import validate_worker_id
from .request_ids import DEFAULT_REQUEST_ID_HEADERS
from .requests import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_TOKENS
from .slow_clients import ClientTimeouts
from .summary import DEFAULT_MAX_BLOCKS
from .upstream import DEFAULT_MAX_RETRIES, DEFAULT_RESENDS_AFTER_RECEIPT

BIND_HELP = "address to listen on (default 127.0.0.1); '' listens on every interface, IPv4 and IPv6"


def register(subparsers: Any) -> None:
    router = subparsers.add_parser("router", help="run the data plane: sidecar (per engine) or gateway")
    sub = router.add_subparsers(dest="router_command", metavar="SERVICE", required=True)

    sc = sub.add_parser(
        "sidecar",
        help="reverse proxy in front of one engine; publishes its cache summary",
        formatter_class=DefaultsHelpFormatter,
    )
    sc.add_argument(
        "--engine", required=True, metavar="URL", help="engine base URL, e.g. http://127.0.0.1:30000"
    )
    sc.add_argument("--redis", metavar="URL", help="Redis URL (redis://host:port/db); omit to only proxy")
    sc.add_argument("--port", type=int, required=True, help="port to listen on")
    sc.add_argument("--host", default="127.0.0.1", help=BIND_HELP)
    sc.add_argument("--worker-id", default="", metavar="ID", help="default: <hostname>-<port>")
    sc.add_argument(
        "--advertise-url", default="", metavar="URL", help="URL gateways use (default http://host:port)"
    )
    sc.add_argument("--fleet", default=DEFAULT_FLEET, metavar="NAME", help="Redis key namespace pf:<NAME>:")
    sc.add_argument(
        "--publish-interval",
        type=float,
        default=0.25,
        metavar="S",
        help="seconds between load publishes (summary published when changed)",
    )
    sc.add_argument(
        "--engine-api",
        choices=ENGINE_APIS,
        default=AUTO,
        help="the engine's API: sglang, vllm, or auto (detected at each engine start: SGLang if "
        "GET /get_server_info answers a JSON object, else vLLM if GET /v1/models answers 200)",
    )
    sc.add_argument(
        "--block-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens per hashed prefix block (published: gateways hash this worker's prompts alike); "
        f"default: a vLLM engine's block_size, else {DEFAULT_BLOCK_TOKENS}",
    )
    sc.add_argument(
        "--cache-tokens",
        type=int,
        default=None,
        metavar="N",
        help="mirror capacity; default: the engine's (SGLang max_total_num_tokens, vLLM "
        "block_size × num_gpu_blocks from vllm:cache_config_info)",
    )
    sc.add_argument(
        "--self-register",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write this worker into the fleet's members hash (off when an operator does)",
    )
    sc.add_argument("--model", default=None, help="cache identity: model name (default: from the engine)")
    sc.add_argument(
        "--revision", default=None, help="cache identity: model revision (default: from the engine)"
    )
    sc.add_argument("--adapter", default="", help="cache identity: adapter (LoRA) name")
    sc.add_argument(
        "--max-summary-blocks",
        type=int,
        default=DEFAULT_MAX_BLOCKS,
        metavar="N",
        help="most block hashes one published summary holds",
    )
    _add_size_limits(sc, prompt_help="longer prompts are forwarded untracked (the engine judges them)")
    sc.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        help="initial prefill-rate estimate (default: the emulator's stated speed, else 30000)",
    )
    sc.add_argument(
        "--warm-exemplar-bytes",
        type=int,
        default=DEFAULT_EXEMPLAR_BYTES,
        metavar="N",
        help="bytes of recent requests kept to pre-warm other replicas (one per prompt, least recently "
        "used dropped; 0 keeps none: this replica is then no pre-warm source)",
    )
    sc.add_argument("--client-write-timeout", type=float, default=None, metavar="S", help=WRITE_TIMEOUT_HELP)
    sc.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    sc.set_defaults(func=run_sidecar)

    gw = sub.add_parser(
        "gateway",
        help="OpenAI/SGLang-compatible entry point routing by prefix and load",
        formatter_class=DefaultsHelpFormatter,
    )
    gw.add_argument("--redis", metavar="URL", help="Redis URL; optional when static --worker URLs are given")
    gw.add_argument("--port", type=int, required=True, help="port to listen on")
    gw.add_argument("--host", default="127.0.0.1", help=BIND_HELP)
    gw.add_argument("--fleet", default=DEFAULT_FLEET, metavar="NAME", help="Redis key namespace pf:<NAME>:")
    gw.add_argument(
        "--policy", default=None, metavar="NAME", help="routing policy (default: the project's default)"
    )
    gw.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="routing policy parameter (a number), e.g. delay_weight=0.5; repeatable",
    )
    gw.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="URL",
        help="static worker (sidecar or engine) URL; repeatable",
    )
    gw.add_argument(
        "--block-tokens",
        type=int,
        default=DEFAULT_BLOCK_TOKENS,
        help="tokens per hashed prefix block for workers that publish none",
    )
    gw.add_argument(
        "--refresh-interval",
        type=float,
        default=0.2,
        metavar="S",
        help="seconds between Redis reads (members and loads; a summary when its version changed)",
    )
    gw.add_argument(
        "--dead-after",
        type=float,
        default=3.0,
        metavar="S",
        help="drop a worker whose heartbeat has not advanced for this long",
    )
    gw.add_argument(
        "--overlay-ttl",
        type=float,
        default=30.0,
        metavar="S",
        help="how long this gateway remembers where it sent a prefix (until a summary shows it)",
    )
    gw.add_argument(
        "--max-retries",
        type=int,
        default=DEFAULT_MAX_RETRIES,
        help="re-sends to other workers after a failure",
    )
    gw.add_argument(
        "--max-resends-after-receipt",
        type=int,
        metavar="N",
        default=DEFAULT_RESENDS_AFTER_RECEIPT,
        help="of those, re-sends of a request a worker received and then failed on (the prompt may be"
        " what crashed it); 0: never",
    )
    _add_size_limits(gw, prompt_help="refuse longer prompts with 413")
    gw.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=DEFAULT_PREFILL_TOKENS_PER_S,
        help="initial prefill-rate estimate (then the fleet's median measured rate)",
    )
    gw.add_argument(
        "--tenant-header",
        default=None,
        metavar="NAME",
        help="tenant isolation: every request must carry this header, set by a trusted proxy "
        "(e.g. X-Prefixfleet-Tenant); it becomes the request's cache_salt",
    )
    gw.add_argument(
        "--request-id-headers",
        nargs="+",
        default=list(DEFAULT_REQUEST_ID_HEADERS),
        metavar="NAME",
        help="headers a client's request id is read from, the first present wins (SGLang router's flag "
        "and defaults); else one is generated. It goes upstream and back to the client in X-Request-Id",
    )
    gw.add_argument("--client-write-timeout", type=float, default=None, metavar="S", help=WRITE_TIMEOUT_HELP)
    gw.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    gw.set_defaults(func=run_gateway)

    ins = sub.add_parser(
        "inspect",
        help="show what a fleet published in Redis (members, load, summaries)",
        formatter_class=DefaultsHelpFormatter,
    )
    ins.add_argument("--redis", required=True, metavar="URL", help="the fleet's Redis URL")
    ins.add_argument("--fleet", default=DEFAULT_FLEET, metavar="NAME", help="Redis key namespace pf:<NAME>:")
    ins.add_argument("--json", metavar="FILE", help="also write the report as JSON ('-' for stdout only)")
    ins.set_defaults(func=run_inspect)

    bench = sub.add_parser(
        "bench-overhead",
        help="latency and CPU each hop adds (engine vs sidecar vs gateway), side by side; table + JSON",
        formatter_class=DefaultsHelpFormatter,
    )
    bench.add_argument("--requests", type=int, default=300, help="per path")
    bench.add_argument("--rate", type=float, default=100.0, help="requests/s per path")
    bench.add_argument("--time-scale", type=float, default=20.0, help="emulator speed-up")
    bench.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    bench.add_argument(
        "--tenant-header",
        default=None,
        metavar="NAME",
        help="measure tenant isolation: the gateway runs with --tenant-header NAME, every request carries it",
    )
    bench.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar")
    bench.set_defaults(func=run_bench_overhead)


LOG_LEVEL_HELP = "DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)"


def _add_size_limits(parser: argparse.ArgumentParser, prompt_help: str) -> None:
    """--max-body-bytes and --max-prompt-tokens, which the sidecar and the gateway both take."""
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help="refuse larger request bodies with 413",
    )
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=DEFAULT_MAX_PROMPT_TOKENS, metavar="N", help=prompt_help
    )


WRITE_TIMEOUT_HELP = (
    "end a streamed answer whose client reads nothing for S seconds (connection closed, engine request"
    " aborted); a positive number, there is no off; default: $PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S, else 60"
)


def _check_common(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.redis is not None:
        _check_redis_url(args.redis)
    if args.block_tokens is not None and args.block_tokens < 1:
        raise UsageError(f"--block-tokens must be positive, got {args.block_tokens}")
    if args.max_body_bytes < 1 or args.max_prompt_tokens < 1:
        raise UsageError("--max-body-bytes and --max-prompt-tokens must be positive")
    if args.prefill_tokens_per_s is not None:
        check_positive("--prefill-tokens-per-s", args.prefill_tokens_per_s)
    timeout = args.client_write_timeout
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--client-write-timeout must be a positive number of seconds, got {timeout:g}")
    try:  # read again when the service starts: a bad value is a traceback there
        ClientTimeouts.from_env(write_s=timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        validate_fleet_name(args.fleet)
    except ValueError as exc:
        raise UsageError(f"--fleet: {exc}") from None
    level = args.log_level.upper()
    if level not in logging.getLevelNamesMapping():
        raise UsageError(
            f"--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {args.log_level!r}"
        )
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def check_http_url(flag: str, url: str) -> str:
    """``url`` (an engine, worker or target) without a trailing '/': an http(s) URL whose host and
    port can be read, else a one-line error naming ``flag`` (every request would fail later)."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{flag} must be an http:// or https:// URL, got {url!r}")
    _check_authority(flag, url)
    if not urlsplit(url).hostname:
        raise UsageError(f"{flag} {url!r} names no host")
    return url.rstrip("/")


def _check_redis_url(url: str) -> None:
    if (problem := redis_url_error(url)) is not None:  # printed without its password
        raise UsageError(f"--redis {without_userinfo(url)!r}: {problem}")


def _check_authority(flag: str, url: str) -> None:
    if (problem := authority_error(url)) is not None:
        raise UsageError(f"{flag} {url!r}: {problem}")


def run_sidecar(args: argparse.Namespace) -> int:
    from .sidecar import ENGINE_API_KEY_ENV, SidecarConfig, control_source, engine_auth, serve

    _check_common(args)
    engine = check_http_url("--engine", args.engine)
    if args.advertise_url:
        # repaired, not refused: the pod spec's http://$(POD_IP):PORT cannot bracket an IPv6 address
        check_http_url("--advertise-url", bracket_ipv6_url(args.advertise_url))
    if args.worker_id:
        try:
            validate_worker_id(args.worker_id)
        except ValueError as exc:
            raise UsageError(f"--worker-id: {exc}") from None
    check_positive("--publish-interval", args.publish_interval)
    if args.cache_tokens is not None and args.cache_tokens < 1:
        raise UsageError("--cache-tokens must be positive")
    if args.max_summary_blocks < 1:
        raise UsageError("--max-summary-blocks must be positive")
    if args.warm_exemplar_bytes < 0:
        raise UsageError(f"--warm-exemplar-bytes must be 0 (none) or more, got {args.warm_exemplar_bytes}")
    config = SidecarConfig(
        engine_url=engine,
        redis_url=args.redis,
        port=args.port,
        host=args.host,
        worker_id=args.worker_id,
        advertise_url=args.advertise_url,
        fleet=args.fleet,
        publish_interval_s=args.publish_interval,
        block_tokens=args.block_tokens,
        cache_tokens=args.cache_tokens,
        engine_api=args.engine_api,
        self_register=args.self_register,
        model=args.model,
        revision=args.revision,
        adapter=args.adapter,
        max_summary_blocks=args.max_summary_blocks,
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        client_write_timeout_s=args.client_write_timeout,
        warm_exemplar_bytes=args.warm_exemplar_bytes,
    )
    try:
        config.resolved_worker_id()
    except ValueError as exc:
        raise UsageError(f"--worker-id: {exc}") from None
    try:  # a secret no header can carry: said before starting, naming its variable (no traceback)
        engine_auth(os.environ.get(ENGINE_API_KEY_ENV))
        control_source(config, os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _run(serve(config), args.host, args.port)


def _policy_params(policy: str, pairs: list[str]) -> dict[str, float]:
    """``KEY=VALUE`` pairs for the policy's constructor, checked by building the policy once."""
    import inspect

    from .policies import POLICIES, make_policy

    known = [p for p in inspect.signature(POLICIES[policy].__init__).parameters if p not in ("self", "cost")]

    params: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            if not sep or not key:
                raise ValueError
            params[key.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--policy-param {pair!r}: expected KEY=NUMBER") from None
        if key.strip() not in known:
            raise UsageError(
                f"--policy-param {key.strip()!r}: {policy} takes {', '.join(known) or 'no parameters'}"
            )
    try:
        make_policy(policy, None, **params)
    except ValueError as exc:
        raise UsageError(f"--policy-param: {exc}") from None
    return params


def run_gateway(args: argparse.Namespace) -> int:
    from .gateway import GatewayConfig, serve
    from .policies import DEFAULT_POLICY, POLICIES

    _check_common(args)
    policy = args.policy or DEFAULT_POLICY
    if policy not in POLICIES:
        raise UsageError(f"unknown --policy {policy!r}; choose from {', '.join(sorted(POLICIES))}")
    params = _policy_params(policy, args.policy_param)
    workers = tuple(check_http_url("--worker", w) for w in args.worker)
    if not args.redis and not workers:
        raise UsageError("give --redis URL, or at least one --worker URL")
    for flag, value in (
        ("--refresh-interval", args.refresh_interval),
        ("--dead-after", args.dead_after),
        ("--overlay-ttl", args.overlay_ttl),
    ):
        check_positive(flag, value)
    for flag, count in (
        ("--max-retries", args.max_retries),
        ("--max-resends-after-receipt", args.max_resends_after_receipt),
    ):
        if count < 0:
            raise UsageError(f"{flag} must not be negative")
    _check_tenant_header(args.tenant_header)
    for name in args.request_id_headers:
        _check_header_name("--request-id-headers", name)
    config = GatewayConfig(
        port=args.port,
        redis_url=args.redis,
        host=args.host,
        fleet=args.fleet,
        policy=policy,
        policy_params=params,
        workers=workers,
        block_tokens=args.block_tokens,
        refresh_interval_s=args.refresh_interval,
        dead_after_s=args.dead_after,
        overlay_ttl_s=args.overlay_ttl,
        max_retries=args.max_retries,
        resends_after_receipt=args.max_resends_after_receipt,
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        tenant_header=args.tenant_header,
        client_write_timeout_s=args.client_write_timeout,
        request_id_headers=tuple(args.request_id_headers),
    )
    return _run(serve(config), args.host, args.port)


def _check_tenant_header(header: str | None) -> None:
    if header is not None:
        _check_header_name("--tenant-header", header)


def _check_header_name(flag: str, header: str) -> None:
    if not (header.isascii() and header.replace("-", "").isalnum()):
        raise UsageError(f"{flag} must be an HTTP header name (letters, digits, '-'), got {header!r}")


def run_bench_overhead(args: argparse.Namespace) -> int:
    from prefixfleet.outputs import output_file, write_json

    from .overhead_bench import format_table, measure

    if args.requests < 1:
        raise UsageError("--requests must be positive")
    check_positive("--rate", args.rate)
    check_positive("--time-scale", args.time_scale)
    json_path = output_file(args.json, "--json")  # before the run: a bad path must not cost it
    _check_tenant_header(args.tenant_header)
    run = measure(args.requests, args.rate, args.time_scale, args.progress, tenant_header=args.tenant_header)
    try:
        report = asyncio.run(run)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    print(format_table(report))
    if json_path is not None:
        write_json(json_path, report)
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    """Print the fleet's records; exit 1 when any is missing or malformed."""
    import time

    import redis.asyncio as aioredis

    from prefixfleet.outputs import output_file, writing

    from .inspect import fleet_report, format_report, report_json
    from .keys import FleetKeys
    from .records import split_member_fields
    from .redis_conn import connect_redis, redacted, redis_error_text

    _check_redis_url(args.redis)
    json_path = output_file(args.json, "--json") if args.json != "-" else None
    try:
        keys = FleetKeys(args.fleet)
    except ValueError as exc:
        raise UsageError(f"--fleet: {exc}") from None

    invalid: list[str] = []  # member names that are no worker id (e.g. junk written into the hash)

    async def read() -> dict[str, Any]:
        client = connect_redis(args.redis, timeout_s=3.0)
        try:
            members = await client.hgetall(keys.members)
            records, unnamed = split_member_fields(members)  # a non-UTF-8 name crashed the inspection
            invalid.extend(name for _, name in unnamed)
            ids = list(records)
            loads = await client.mget([keys.load(w) for w in ids]) if ids else []
            summaries = await client.mget([keys.summary(w) for w in ids]) if ids else []
        finally:
            await client.aclose()
        return fleet_report(
            records, dict(zip(ids, loads, strict=True)), dict(zip(ids, summaries, strict=True)), time.time()
        )

    try:
        report = asyncio.run(read())
    except (aioredis.RedisError, OSError) as exc:
        raise UsageError(f"cannot read {redacted(args.redis)}: {redis_error_text(exc)}") from None
    for wid in invalid:
        print(f"prefixfleet router inspect: ignoring member {wid!r}: not a valid worker id", file=sys.stderr)
    if invalid:  # malformed like a bad record: the fleet is not healthy
        report.update(invalid_members=invalid, healthy=False)
    if args.json == "-":
        print(report_json(report))
    else:
        print(f"fleet {args.fleet}: {len(report['workers'])} member(s)")
        print(format_report(report))
        if json_path is not None:
            with writing(json_path, "--json"):
                json_path.write_text(report_json(report) + "\n", encoding="utf-8")
    return 0 if report["healthy"] else 1


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: it roughly halves the event loop's share of a proxied request."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _run(main: Coroutine[Any, Any, None], host: str, port: int) -> int:
    """Run a service until SIGINT/SIGTERM, then shut it down cleanly (deregistering from Redis)."""

    async def runner() -> None:
        task = asyncio.ensure_future(main)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as loop_runner:
            loop_runner.run(runner())
    except OSError as exc:  # e.g. the port is taken: name the flag, not the event loop's errno text
        raise UsageError(listen_error(host, port, exc) or str(exc)) from None
    return 0
