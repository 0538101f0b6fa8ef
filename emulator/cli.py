"""`prefixfleet emulator`: run one GPU-free engine speaking SGLang's HTTP API (or, with --api vllm,
vLLM's) until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping

from prefixfleet.cli import DefaultsHelpFormatter, check_positive, listen_error
from prefixfleet.router.slow_clients import ClientTimeouts

from .auth import key_problem
from .config import DEFAULT_MODEL, EmulatorConfig
from .sglang_options import SglangOptions, parse_lora_path
from .vllm_api import DEFAULT_BLOCK_SIZE, DEV_MODE_ENV, RUNTIME_LORA_ENV, VllmOptions
from .vllm_protocol import parse_lora_module

_DEFAULTS = EmulatorConfig()

# Generous bounds on the speed flags: any finite positive value used to be taken, and at
# --time-scale 1e-300 (or a prefill/decode rate of 1e-300) one decode step lasts 1e298 s, so no
# request ever finishes; at the other end rates like 1e300 overflow the sidecar's arithmetic.
# (flag, least, most)
TIME_SCALE_RANGE = (1e-3, 1e6)  # 1000x slower .. a million times faster than modelled
PREFILL_RATE_RANGE = (1.0, 1e12)  # tokens/s
DECODE_RATE_RANGE = (1e-2, 1e9)  # tokens/s of one request: a step of 100 s .. 1 ns


def check_range(flag: str, value: float, bounds: tuple[float, float]) -> None:
    """``value`` must be a finite number within ``bounds`` (inclusive): one line naming the flag."""
    from prefixfleet.cli import UsageError

    check_positive(flag, value)
    least, most = bounds
    if not least <= value <= most:
        raise UsageError(f"{flag} must be between {least:g} and {most:g}, got {value:g}")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "emulator",
        help="run a GPU-free engine emulator (SGLang's or vLLM's HTTP API, radix cache, prefill/decode "
        "timing model)",
        description=(
            "A GPU-free LLM engine speaking SGLang's HTTP API (or, with --api vllm, vLLM's "
            "OpenAI-compatible server's): a radix KV cache of fixed capacity, a serial chunked prefill "
            "queue whose time grows with uncached tokens, batched decode, sglang:* (vllm:*) Prometheus "
            "metrics. See docs/emulator.md."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, required=True, help="TCP port to listen on (0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    p.add_argument("--model-revision", default=_DEFAULTS.model_revision, help="model revision")
    p.add_argument("--cache-tokens", type=int, default=_DEFAULTS.cache_tokens, help="KV pool size in tokens")
    p.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=_DEFAULTS.prefill_tokens_per_s,
        help=f"prefill speed for uncached tokens; {PREFILL_RATE_RANGE[0]:g} to {PREFILL_RATE_RANGE[1]:g}",
    )
    p.add_argument(
        "--decode-tokens-per-s",
        type=float,
        default=1.0 / _DEFAULTS.decode_step_s,
        help="decode speed of one request at batch size 1 (one step = 1/D s; steps grow mildly with batch); "
        f"{DECODE_RATE_RANGE[0]:g} to {DECODE_RATE_RANGE[1]:g}",
    )
    p.add_argument("--max-running", type=int, default=_DEFAULTS.max_running, help="max running requests")
    p.add_argument(
        "--chunk-tokens", type=int, default=_DEFAULTS.chunk_tokens, help="uncached tokens per prefill pass"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=_DEFAULTS.time_scale,
        help="speed-up: every modelled duration is divided by this (reported latencies stay modelled); "
        f"{TIME_SCALE_RANGE[0]:g} to {TIME_SCALE_RANGE[1]:g}",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longest accepted prompt (default: min(65536, cache tokens - 1))",
    )
    p.add_argument(
        "--max-new-tokens-limit",
        type=int,
        default=_DEFAULTS.max_new_tokens_limit,
        help="largest accepted max_new_tokens / max_tokens",
    )
    p.add_argument(
        "--cache-on-compute",
        action="store_true",
        help="SGLang-like cache insertion: a prompt's tokens are cached for other requests only once the "
        "prefill pass computing them completes (default: the whole prompt at admission, optimistic)",
    )
    p.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="as SGLang's flag: /v1/completions and /v1/chat/completions usage carries prompt_tokens_details."
        "cached_tokens (when > 0; null otherwise); without it never. /generate reports it always",
    )
    p.add_argument(
        "--api",
        choices=["sglang", "vllm"],
        default="sglang",
        help="the HTTP API to serve: SGLang's, or vLLM's OpenAI-compatible server's (vllm:* metrics, "
        "block-granular cache hits; /reset_prefix_cache with VLLM_SERVER_DEV_MODE=1)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help=f"vLLM's KV block size in tokens (--api vllm only; default {DEFAULT_BLOCK_SIZE}): cache hits "
        "count whole blocks; --cache-tokens must be a multiple of it (num_gpu_blocks = cache tokens / "
        "block size)",
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help='as vLLM\'s flag (--api vllm only): usage.prompt_tokens_details is {"cached_tokens": N}; '
        "without it null",
    )
    p.add_argument(
        "--enable-lora",
        action="store_true",
        help="as vLLM's and SGLang's flag: serve LoRA adapters; requests naming one are cached apart, "
        "one naming an adapter not loaded is refused (SGLang) or a 404 (vLLM)",
    )
    p.add_argument(
        "--lora-paths",
        nargs="+",
        default=None,
        metavar="LORA",
        help="as SGLang's flag (--api sglang; turns --enable-lora on): adapters loaded at start, each PATH "
        '(its own name), NAME=PATH or JSON {"lora_name": ..., "lora_path": ..., "pinned": ...}; a request '
        'names one by lora_path or by model "base:NAME" (no weights are read)',
    )
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="MODULE",
        help="as vLLM's flag (--api vllm only, with --enable-lora): adapters loaded at start, each "
        'name=path or JSON {"name": ..., "path": ..., "base_model_name": ...}; /v1/models lists each '
        "with its parent, a request whose model names one is cached under it (no weights are read)",
    )
    p.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        metavar="KEY",
        help="as the engines' flag: requests must carry 'Authorization: Bearer KEY' (else 401 "
        '{"error": "Unauthorized"}): with --api vllm on /v1/* (one of several keys), with --api sglang '
        "everywhere but /health* and /metrics* (one key). Unlike vLLM, VLLM_API_KEY is not read (a "
        "client's VLLM_API_KEY in the shell would key every emulator 'prefixfleet up' starts); in a pod "
        "give --api-key $(VAR), which Kubernetes expands from the container's env",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help="refuse a client's token ids (input_ids, a token-id prompt) of N or more, as a real engine "
        "does beyond its vocabulary (SGLang's or vLLM's error); default: any id. Text is tokenized as always",
    )
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="logging threshold"
    )
    p.set_defaults(func=run)

    from .bench import register as register_bench

    register_bench(subparsers)


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    from prefixfleet.cli import UsageError

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if not args.host.strip():  # aiohttp would bind every interface: say which one
        raise UsageError("--host is empty; give an address to bind, e.g. 127.0.0.1")
    check_range("--time-scale", args.time_scale, TIME_SCALE_RANGE)
    check_range("--prefill-tokens-per-s", args.prefill_tokens_per_s, PREFILL_RATE_RANGE)
    check_range("--decode-tokens-per-s", args.decode_tokens_per_s, DECODE_RATE_RANGE)  # inf: steps of no time
    try:
        return EmulatorConfig(
            model=args.model,
            model_revision=args.model_revision,
            cache_tokens=args.cache_tokens,
            prefill_tokens_per_s=args.prefill_tokens_per_s,
            decode_step_s=1.0 / args.decode_tokens_per_s,
            max_running=args.max_running,
            chunk_tokens=args.chunk_tokens,
            time_scale=args.time_scale,
            max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens_limit=args.max_new_tokens_limit,
            cache_on_compute=args.cache_on_compute,
            enable_cache_report=args.enable_cache_report,
            vocab_size=args.vocab_size,
        )
    except ValueError as exc:
        raise UsageError(_as_flags(str(exc), args)) from None


def vllm_options_from_args(
    args: argparse.Namespace, config: EmulatorConfig, environ: Mapping[str, str] = os.environ
) -> VllmOptions | None:
    """The vLLM face's options (None: serve SGLang's API). vLLM's flags are refused with --api sglang
    and SGLang's --enable-cache-report with --api vllm: each is the other engine's, and silently
    ignoring it would serve usage the caller did not ask for."""
    from prefixfleet.cli import UsageError

    api = getattr(args, "api", "sglang")
    block_size = getattr(args, "block_size", None)
    details = getattr(args, "enable_prompt_tokens_details", False)
    enable_lora = getattr(args, "enable_lora", False)
    lora_modules = getattr(args, "lora_modules", None)
    if api != "vllm":
        if lora_modules is not None:
            raise UsageError("--lora-modules is vLLM's flag; with --api sglang use --lora-paths")
        for flag, given in (
            ("--block-size", block_size is not None),
            ("--enable-prompt-tokens-details", details),
        ):
            if given:
                raise UsageError(f"{flag} is vLLM's flag: give it with --api vllm")
        return None
    if args.enable_cache_report:
        raise UsageError(
            "--enable-cache-report is SGLang's flag; with --api vllm use --enable-prompt-tokens-details"
        )
    if getattr(args, "lora_paths", None) is not None:
        raise UsageError("--lora-paths is SGLang's flag; with --api vllm use --lora-modules")
    # The flag only: vLLM also reads VLLM_API_KEY, but that is often a client's setting in a shell, and
    # every emulator `prefixfleet up` starts inherits the shell's environment: it would key them all
    # while their sidecars carry no key. Empty keys are dropped, as vLLM drops them (no key: open).
    api_keys = tuple(k for k in getattr(args, "api_key", None) or () if k)
    _check_keys(api_keys)
    raw = environ.get(DEV_MODE_ENV, "0").strip() or "0"
    try:  # as vLLM's envs.py reads it: bool(int(value))
        dev_mode = bool(int(raw))
    except ValueError:
        raise UsageError(f"{DEV_MODE_ENV} must be an integer (0 or 1), got {raw!r}") from None
    # as vLLM's envs.py reads it: "1" or "true", any case
    runtime_lora = environ.get(RUNTIME_LORA_ENV, "0").strip().lower() in ("1", "true")
    try:
        loras = tuple(parse_lora_module(item) for item in lora_modules or () if item)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = VllmOptions(
        block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size,
        enable_prompt_tokens_details=details,
        dev_mode=dev_mode,
        enable_lora=enable_lora,
        lora_modules=loras,
        runtime_lora_updating=runtime_lora,
        api_keys=api_keys,
    )
    problems = options.problems(config)
    if problems:
        raise UsageError(_as_flags(problems[0].replace("block_size", "--block-size"), args))
    return options


def _check_keys(keys: tuple[str, ...]) -> None:
    from prefixfleet.cli import UsageError

    for key in keys:
        problem = key_problem(key)
        if problem:
            raise UsageError(problem)


def sglang_options_from_args(args: argparse.Namespace) -> SglangOptions | None:
    """The SGLang face's options (None: the process serves vLLM's API, whose flags are checked by
    :func:`vllm_options_from_args`)."""
    from prefixfleet.cli import UsageError

    if getattr(args, "api", "sglang") == "vllm":
        return None
    keys = [k for k in getattr(args, "api_key", None) or () if k]  # SGLang: an empty key is no key
    if len(keys) > 1:
        raise UsageError("--api-key takes one key with --api sglang (SGLang's flag is a single key)")
    _check_keys(tuple(keys))
    try:
        loras = tuple(parse_lora_path(item) for item in getattr(args, "lora_paths", None) or ())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = SglangOptions(
        enable_lora=getattr(args, "enable_lora", False), lora_paths=loras, api_key=keys[0] if keys else None
    )
    problems = options.problems()
    if problems:
        raise UsageError(problems[0])
    return options


def _as_flags(problem: str, args: argparse.Namespace) -> str:
    """EmulatorConfig's refusal with each field it names as the flag that set it: the user typed
    --max-running, not max_running."""
    if args.max_prompt_tokens is None and problem.startswith("max_prompt_tokens ("):
        # the default prompt limit (cache tokens - 1) is what clashed: the flag given was --cache-tokens
        need = "a prompt and its first output token"
        return f"--cache-tokens must be at least 2 ({need}), got {args.cache_tokens}"
    flags = sorted((f for f in vars(args) if f in EmulatorConfig.__dataclass_fields__), key=len, reverse=True)
    return re.sub(rf"\b({'|'.join(flags)})\b", lambda m: "--" + m.group(1).replace("_", "-"), problem)


async def serve(
    config: EmulatorConfig,
    host: str,
    port: int,
    vllm: VllmOptions | None = None,
    sglang: SglangOptions | None = None,
) -> None:
    from .server import EmulatorServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = EmulatorServer(config, host, port, vllm, sglang)
    await server.start()
    # One parseable line for supervisors that start us with --port 0.
    print(f"prefixfleet emulator {config.model} listening on {server.url}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        print("prefixfleet emulator stopped", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from prefixfleet.cli import UsageError

    config = config_from_args(args)
    vllm = vllm_options_from_args(args, config)
    sglang = sglang_options_from_args(args)
    try:  # read again when the server starts, where a bad value was a traceback
        ClientTimeouts.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(serve(config, args.host, args.port, vllm, sglang))
    except OSError as exc:
        problem = listen_error(args.host, args.port, exc)
        problem = problem or f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        raise UsageError(problem) from None
    return 0
