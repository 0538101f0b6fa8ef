"""`prefixfleet emulator-bench`: what the emulator's timing model says, and how faithfully it runs.

Two parts, printed as tables and written as JSON:

* **model** (virtual clock, deterministic): TTFT of SGLang's generated-shared-prefix shape (2048-token
  system prompt + 128-token question) cold and warm, and decode-step times by batch size.
* **http** (real HTTP on 127.0.0.1 against an emulator *process*, as a fleet runs it): a closed-loop
  client sends
  requests with a shared prefix at a fixed concurrency; reports requests/s and how far the wall-clock
  latency drifts from the modelled latency / time-scale (the event-loop overhead). Use it to pick a
  time-scale that keeps ratios honest on a given machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from tqdm import tqdm

from prefixfleet.cli import DefaultsHelpFormatter

from .cli import TIME_SCALE_RANGE, check_range
from .config import EmulatorConfig
from .engine import EngineModel, make_request, run_until_idle


def model_table(config: EmulatorConfig) -> dict[str, object]:
    system = list(range(1, 2049))
    model = EngineModel(config)
    cold = make_request("cold", [*system, *range(100_000, 100_128)], 1, [7], 0.0)
    model.submit(cold)
    now, _ = run_until_idle(model, 0.0)
    warm = make_request("warm", [*system, *range(200_000, 200_128)], 1, [7], now)
    model.submit(warm)
    run_until_idle(model, now)
    cold_ttft = cold.first_token_at - cold.arrival  # type: ignore[operator]
    warm_ttft = warm.first_token_at - warm.arrival  # type: ignore[operator]
    return {
        "cold_ttft_ms": round(cold_ttft * 1000, 3),
        "warm_ttft_ms": round(warm_ttft * 1000, 3),
        "cold_over_warm": round(cold_ttft / warm_ttft, 2),
        "decode_step_ms": {str(b): round(config.decode_seconds(b) * 1000, 3) for b in (1, 8, 32, 64)},
    }


async def http_run(
    config: EmulatorConfig, requests: int, concurrency: int, max_new: int
) -> dict[str, object]:
    proc, url = await _start_process(config)
    try:
        async with aiohttp.ClientSession() as http:
            await _wait_healthy(http, url, proc)
            report = await _closed_loop(http, url, config, requests, concurrency, max_new)
        if report["errors"]:  # a process that died fails every request after: name it, not the count
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=1.0)
        if proc.returncode is not None:
            from prefixfleet.cli import UsageError

            raise UsageError(
                f"the emulator (--time-scale {config.time_scale:g}) exited with {proc.returncode} during "
                f"the run; {report['errors']} of {requests} requests failed"
            )
        return report
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it may have died since
                proc.terminate()
        await proc.wait()


async def _start_process(config: EmulatorConfig) -> tuple[asyncio.subprocess.Process, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = "import sys; from prefixfleet.cli import main; sys.exit(main())"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, "emulator", "--port", str(port), "--time-scale", str(config.time_scale),
        "--log-level", "warning", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


async def _wait_healthy(http: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process) -> None:
    for _ in range(300):
        if proc.returncode is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode}")
        try:
            async with http.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"emulator at {url} did not become healthy")


async def _closed_loop(
    http: aiohttp.ClientSession,
    url: str,
    config: EmulatorConfig,
    requests: int,
    concurrency: int,
    max_new: int,
) -> dict[str, object]:
    system = " ".join(f"sys{i}" for i in range(1024))
    wall: list[float] = []
    modelled: list[float] = []
    errors = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    bar = tqdm(total=requests, desc="emulator-bench http", file=sys.stderr, leave=False)

    async def client() -> None:
        nonlocal errors
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            body = {"text": f"{system} question {i}", "sampling_params": {"max_new_tokens": max_new}}
            t0 = time.perf_counter()
            try:
                async with http.post(url + "/generate", json=body) as r:
                    # an error answer need not be JSON (a proxy's or aiohttp's plain-text 500)
                    data = await r.json() if r.status == 200 else None
                latency = data["meta_info"]["e2e_latency"] if data is not None else None
            except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError):
                latency = None  # reset, refused, or not the emulator's answer: a failed request
            if latency is None:
                errors += 1
            else:
                wall.append(time.perf_counter() - t0)
                modelled.append(latency / config.time_scale)
            bar.update(1)

    t_start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t_start
    bar.close()
    overhead = [w - m for w, m in zip(wall, modelled, strict=True)]
    return {
        "time_scale": config.time_scale,
        "requests": requests,
        "concurrency": concurrency,
        "max_new_tokens": max_new,
        "errors": errors,
        "requests_per_s": round(len(wall) / elapsed, 1),
        "wall_e2e_ms_mean": round(statistics.fmean(wall) * 1000, 3) if wall else None,
        "modelled_e2e_ms_mean_scaled": round(statistics.fmean(modelled) * 1000, 3) if modelled else None,
        "client_overhead_ms_p50": round(statistics.median(overhead) * 1000, 3) if overhead else None,
    }


# (heading, key in a run's report, width) of each column of the http table
_COLUMNS = (
    ("time-scale", "time_scale", 10),
    ("req/s", "requests_per_s", 8),
    ("wall e2e ms", "wall_e2e_ms_mean", 12),
    ("model/ts ms", "modelled_e2e_ms_mean_scaled", 12),
    ("overhead p50 ms", "client_overhead_ms_p50", 16),
    ("errors", "errors", 7),
)


def http_table(runs: list[dict[str, object]]) -> list[str]:
    """The http runs as printed lines. A run whose requests all failed has no latency (None in the
    JSON): shown as "-" (the format of a None was a TypeError, after the whole run)."""
    lines = [" ".join(f"{heading:>{width}}" for heading, _key, width in _COLUMNS)]
    for r in runs:
        cells = ("-" if r[key] is None else r[key] for _heading, key, _width in _COLUMNS)
        lines.append(
            " ".join(f"{cell:>{width}}" for cell, (_h, _k, width) in zip(cells, _COLUMNS, strict=True))
        )
    return lines


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "emulator-bench",
        help="measure the emulator's timing model and its HTTP overhead on this machine",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--requests", type=int, default=400, help="HTTP requests per time-scale")
    p.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    p.add_argument("--max-new-tokens", type=int, default=16, help="output tokens per request")
    p.add_argument(
        "--time-scale",
        type=float,
        nargs="+",
        default=[1.0, 10.0, 50.0],
        help="emulator speed-ups to measure, one emulator process each",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from prefixfleet.cli import UsageError
    from prefixfleet.outputs import output_file, write_json

    for flag, value, least in (
        ("--requests", args.requests, 1),
        ("--concurrency", args.concurrency, 1),
        ("--max-new-tokens", args.max_new_tokens, 0),
    ):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    limit = EmulatorConfig().max_new_tokens_limit  # the emulators it starts run with default flags
    if args.max_new_tokens > limit:
        # else every request is refused (400) and the table had no latency to print: a traceback
        raise UsageError(
            f"--max-new-tokens must be at most {limit} (the emulator's --max-new-tokens-limit), "
            f"got {args.max_new_tokens}"
        )
    for time_scale in args.time_scale:
        check_range("--time-scale", time_scale, TIME_SCALE_RANGE)
    json_path = output_file(args.json, "--json")
    try:
        configs = [EmulatorConfig(time_scale=ts) for ts in args.time_scale]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    model = model_table(EmulatorConfig())
    print("timing model (default flags, modelled time)")
    print(
        f"  2048+128-token prompt: cold TTFT {model['cold_ttft_ms']} ms, "
        f"warm TTFT {model['warm_ttft_ms']} ms ({model['cold_over_warm']}x)"
    )
    steps = model["decode_step_ms"]
    assert isinstance(steps, dict)
    print("  decode step ms by batch: " + ", ".join(f"{b}: {v}" for b, v in steps.items()))
    from prefixfleet.fleet.processes import run_until_signalled

    runs = []
    for c in configs:
        try:
            # SIGTERM, like Ctrl-C, cancels the run so its emulator process is stopped, not orphaned
            runs.append(
                run_until_signalled(
                    lambda c=c: http_run(c, args.requests, args.concurrency, args.max_new_tokens)
                )
            )
        except asyncio.CancelledError:
            print("prefixfleet emulator-bench: stopped by SIGTERM; its emulator was stopped", file=sys.stderr)
            raise SystemExit(143) from None
    print()
    print("\n".join(http_table(runs)))
    if json_path:
        write_json(json_path, {"model": model, "http": runs})
        print(f"\nwrote {json_path}")
    return 0
