"""`prefixfleet compare`: our gateway against the real sglang-router on the same emulated fleet.

One fleet of emulated engines (each behind a sidecar) serves the same workload three times, caches
flushed in between: through our gateway with the default policy, through our gateway with
round_robin, and through the PyPI ``sglang-router`` with ``--policy cache_aware`` and its CLI
defaults. sglang-router is pointed straight at the engines, not at our sidecars: it keeps its own
approximate tree from the requests it routes and needs nothing from a sidecar, so the direct path
is its native deployment and spares it a proxy hop ours pays for (the comparison is therefore, if
anything, tilted in its favour).

The gateway's added latency is measured separately and side by side: small non-streaming
``/generate`` requests at a fixed rate, each instant sending one request through the gateway and
one straight to an engine, so both paths see the same machine load; reported as the difference of
the two latency distributions' p50 and p99.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from prefixfleet.cli import counted
from prefixfleet.fleet.load import (
    LoadRequest,
    LoadRun,
    discover_model,
    format_table,
    percentile,
    requests_from_workload,
    run_load,
    send_one,
    ttfts_ms,
)
from prefixfleet.fleet.local import FleetSpec, LocalFleet, engine_for_workload, machine_load, workload_slice
from prefixfleet.fleet.processes import LOOPBACK, Supervisor
from prefixfleet.router.policies import DEFAULT_POLICY

TRACE_RELATIVE = Path("traces") / "mooncake_synthetic_trace.jsonl"
ROUTERS = ("prefixfleet", "round_robin", "sglang_cache_aware")


@dataclass(frozen=True, slots=True)
class CompareOptions:
    requests: int = 600
    replicas: int = 4
    block_tokens: int = 16
    time_scale: float = 4.0
    cache_tokens: int | None = None
    prefill_tokens_per_s: float | None = None
    max_output_tokens: int = 4
    latency_rate_rps: float = 100.0
    latency_seconds: float = 5.0
    latency_prompt_tokens: int = 16
    gateways: int = 1  # one process each: our gateway vs sglang-router
    repeats: int = 1  # rounds of (ours, round_robin, sglang); results pooled per router
    concurrency: int = 512
    timeout_s: float = 300.0
    run_dir: Path = Path("out/compare-run")
    progress: bool = True


def default_trace_path() -> Path | None:
    """The Mooncake synthetic trace shipped in the repository (``traces/``), or None."""
    repo_root = Path(__file__).resolve().parents[2]
    for base in (repo_root, Path.cwd()):
        candidate = (base / TRACE_RELATIVE).resolve()
        if candidate.is_file():
            return candidate
    return None


def path_as_typed(path: Path, cwd: Path) -> str:
    """``path`` as a user working in ``cwd`` would type it: relative when it lies under ``cwd``
    (the docs' ``trace:traces/mooncake_synthetic_trace.jsonl``), else absolute (a trace found
    beside the package while working elsewhere is named where it really is)."""
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def sglang_router_available() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def sglang_router_argv(port: int, prometheus_port: int, worker_urls: Sequence[str]) -> list[str]:
    """The real sglang-router, cache_aware with the defaults its CLI gives users, loopback only."""
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", LOOPBACK,
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", "cache_aware",
        "--prometheus-host", LOOPBACK,
        "--prometheus-port", str(prometheus_port),
        "--log-level", "warn",
    ]  # fmt: skip


def _serves_model(url: str, model: str) -> Callable[[], Awaitable[bool]]:
    """Readiness of sglang-router: its /health answers before its workers are registered."""

    async def ready() -> bool:
        async with aiohttp.ClientSession() as session:
            return await discover_model(session, url) == model

    return ready


def metric_series(text: str, name: str) -> dict[str, float]:
    """Prometheus text exposition: label-string -> value for every sample of metric ``name``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        rest = head[len(name) :]
        if rest and not rest.startswith("{"):
            continue  # a longer metric name sharing the prefix
        try:
            out[rest] = float(value)
        except ValueError:
            continue
    return out


async def scrape(urls: Sequence[str], name: str) -> list[float]:
    """Sum of metric ``name`` on each URL's /metrics (NaN where unreachable)."""
    out = []
    async with aiohttp.ClientSession() as session:
        for url in urls:
            try:
                async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    text = await resp.text()
                out.append(sum(metric_series(text, name).values()))
            except (aiohttp.ClientError, TimeoutError):
                out.append(float("nan"))
    return out


async def gateway_decisions(url: str) -> dict[str, float]:
    """Routing decisions by reason, from the gateway's own metrics."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp,
    ):
        text = await resp.text()
    series = metric_series(text, "prefixfleet_gateway_routing_decisions_total")
    return {labels.strip("{}"): value for labels, value in series.items()}


def pool(runs: Sequence[LoadRun]) -> LoadRun:
    """Several replays of the same workload as one sample (outcomes pooled, durations summed)."""
    return LoadRun([o for r in runs for o in r.outcomes], sum(r.duration_s for r in runs))


def router_row(run: LoadRun) -> dict[str, Any]:
    s = run.summary
    return {
        "mean_ttft_ms": s.mean_ttft_ms,
        "p99_ttft_ms": s.p99_ttft_ms,
        "hit_rate": s.hit_rate,
        "errors": s.errors,
    }


def router_detail(run: LoadRun) -> dict[str, Any]:
    s = run.summary
    return {
        "p50_ttft_ms": s.p50_ttft_ms,
        "requests": s.requests,
        "completed": s.completed,
        "throughput_rps": s.throughput_rps,
        "duration_s": s.duration_s,
        "mean_client_lag_ms": s.mean_client_lag_ms,
        "error_kinds": s.error_kinds,
    }


def added_latency(gateway_ms: Sequence[float], direct_ms: Sequence[float]) -> dict[str, float]:
    """Gateway-path minus direct-path latency, quantile by quantile (p50, p99)."""
    return {
        "p50": percentile(gateway_ms, 0.50) - percentile(direct_ms, 0.50),
        "p99": percentile(gateway_ms, 0.99) - percentile(direct_ms, 0.99),
    }


def _latencies_ms(outcomes: Sequence[Any]) -> list[float]:
    return [o.latency_s * 1000.0 for o in outcomes if o.ok and o.latency_s is not None]


def _probe(kind: str, i: int, words: int) -> LoadRequest:
    # Unique words per probe: both paths miss the cache alike, nothing is shared between them.
    text = " ".join(f"{kind}{i}w{j}" for j in range(words))
    return LoadRequest(0.0, text, words, 1)


async def measure_added_latency(
    gateway_url: str,
    engine_urls: Sequence[str],
    *,
    rate_rps: float,
    seconds: float,
    prompt_tokens: int = 16,
    warmup: int = 20,
    sequential: int = 100,
) -> dict[str, Any]:
    """Latency through the gateway vs straight to an engine, both paths at ``rate_rps``, interleaved."""
    count = max(1, round(rate_rps * seconds))
    connector = aiohttp.TCPConnector(limit=0)
    gateway_out: list[Any] = []
    direct_out: list[Any] = []
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(target: str, req: LoadRequest, t_sched: float, sink: list[Any] | None) -> None:
            delay = t_sched - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = await send_one(
                session, target, req, index=0, api="sglang", stream=False, model=None,
                t_scheduled=t_sched, timeout_s=30.0,
            )  # fmt: skip
            if sink is not None:
                sink.append(outcome)

        t_warm = time.perf_counter() + 0.02
        await asyncio.gather(
            *(
                one(url, _probe(kind, -1 - i, prompt_tokens), t_warm + i * 0.01, None)
                for i in range(warmup)
                for kind, url in (("g", gateway_url), ("d", engine_urls[i % len(engine_urls)]))
            )
        )
        t0 = time.perf_counter() + 0.05
        tasks = []
        for i in range(count):
            t = t0 + i / rate_rps
            tasks.append(one(gateway_url, _probe("g", i, prompt_tokens), t, gateway_out))
            tasks.append(one(engine_urls[i % len(engine_urls)], _probe("d", i, prompt_tokens), t, direct_out))
        await asyncio.gather(*tasks)
        # Diagnostic, not the reported figure: one request at a time (no contention), alternating paths.
        seq_gw: list[Any] = []
        seq_direct: list[Any] = []
        for i in range(sequential):
            await one(gateway_url, _probe("sg", i, prompt_tokens), time.perf_counter(), seq_gw)
            await one(
                engine_urls[i % len(engine_urls)],
                _probe("sd", i, prompt_tokens),
                time.perf_counter(),
                seq_direct,
            )
    gw, direct = _latencies_ms(gateway_out), _latencies_ms(direct_out)
    idle = added_latency(_latencies_ms(seq_gw), _latencies_ms(seq_direct))
    return {
        "added": added_latency(gw, direct),
        "detail": {
            "rate_rps_per_path": rate_rps,
            "requests_per_path": count,
            "prompt_tokens": prompt_tokens,
            "api": "POST /generate, non-streaming, max_new_tokens 1",
            "gateway_p50_ms": percentile(gw, 0.5),
            "gateway_p99_ms": percentile(gw, 0.99),
            "direct_p50_ms": percentile(direct, 0.5),
            "direct_p99_ms": percentile(direct, 0.99),
            "gateway_errors": count - len(gw),
            "direct_errors": count - len(direct),
            "path": "client -> gateway -> sidecar -> engine  vs  client -> engine",
            "one_at_a_time_added_p50_ms": idle["p50"],
            "one_at_a_time_added_p99_ms": idle["p99"],
            "one_at_a_time_requests_per_path": sequential,
        },
    }


async def run_compare(
    workload: Any, options: CompareOptions
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Run the three routers and the added-latency probe; returns (report, TTFTs per router)."""
    chosen = workload_slice(workload, 0, options.max_output_tokens)
    requests = requests_from_workload(replace(workload, requests=chosen))
    engine = engine_for_workload(
        workload,
        options.replicas,
        time_scale=options.time_scale,
        cache_tokens=options.cache_tokens,
        prefill_tokens_per_s=options.prefill_tokens_per_s,
        output_tokens=options.max_output_tokens,
    )
    spec = FleetSpec(replicas=options.replicas, gateways=options.gateways, engine=engine)
    runs: dict[str, list[LoadRun]] = {name: [] for name in ROUTERS}
    served: dict[str, list[float]] = {}
    skipped: dict[str, str] = {}
    latency: dict[str, Any] = {}
    decisions: dict[str, float] = {}

    async def replay(name: str, targets: Sequence[str]) -> None:
        before = await scrape(fleet.engine_urls, "sglang:num_requests_total")
        replayed = run_load(
            requests,
            targets,
            api="openai",
            speedup=options.time_scale,
            concurrency=options.concurrency,
            timeout_s=options.timeout_s,
            progress=options.progress,
            desc=name,
            model=engine.model,  # sglang-router rejects completions without one (422)
        )
        # a process that dies during the replay makes it invalid: named at once, as `up` does
        runs[name].append(await fleet.sup.while_alive(replayed))
        after = await scrape(fleet.engine_urls, "sglang:num_requests_total")
        counts = [a - b for a, b in zip(after, before, strict=True)]
        served[name] = [x + y for x, y in zip(served.get(name, [0.0] * len(counts)), counts, strict=True)]

    before = machine_load()
    async with Supervisor(options.run_dir) as sup:
        fleet = LocalFleet(sup, spec)
        await fleet.start_engines()
        for repeat in range(options.repeats):  # every router once per round, caches flushed before each
            await fleet.reset()
            await fleet.start_gateways(DEFAULT_POLICY)
            await replay("prefixfleet", fleet.gateway_urls)
            for reason, count in (await gateway_decisions(fleet.gateway_urls[0])).items():
                decisions[reason] = decisions.get(reason, 0.0) + count
            if repeat == 0:
                latency = await measure_added_latency(
                    fleet.gateway_urls[0],
                    fleet.engine_urls,
                    rate_rps=options.latency_rate_rps,
                    seconds=options.latency_seconds,
                    prompt_tokens=options.latency_prompt_tokens,
                )
            await fleet.reset()
            await fleet.start_gateways("round_robin")
            await replay("round_robin", fleet.gateway_urls)
            await fleet.reset()
            if sglang_router_available():
                port, prom = sup.allocate_port(), sup.allocate_port()
                url = f"http://{LOOPBACK}:{port}"
                router = await sup.start(
                    "sglang-router",
                    sglang_router_argv(port, prom, fleet.engine_urls),
                    ready=_serves_model(url, engine.model),
                    url=url,
                )
                await replay("sglang_cache_aware", [url])
                await sup.stop(router)
            else:
                skipped["sglang_cache_aware"] = (
                    "the sglang_router module is not installed (pip install sglang-router)"
                )
            sup.check_alive()

    pooled = {name: pool(r) for name, r in runs.items() if r}
    shares = {name: [round(x / sum(c), 4) if sum(c) else math.nan for x in c] for name, c in served.items()}
    routers: dict[str, Any] = {name: router_row(pooled[name]) for name in ROUTERS if name in pooled}
    for name, reason in skipped.items():
        routers[name] = {"skipped": reason}
    report = {
        "workload": workload.name,
        "routers": routers,
        "added_latency_ms": latency["added"],
        "settings": {
            "requests": len(requests),
            "repeats": options.repeats,
            "replicas": spec.replicas,
            "gateways": spec.gateways,
            "default_policy": DEFAULT_POLICY,
            "engine": {
                "cache_tokens": engine.cache_tokens,
                "prefill_tokens_per_s": engine.prefill_tokens_per_s,
                "time_scale": engine.time_scale,
            },
            "max_output_tokens": options.max_output_tokens,
            "workload": {k: v for k, v in workload.settings.items() if k != "path"},
            "sglang_router": "python -m sglang_router.launch_router --policy cache_aware (CLI defaults), "
            "pointed straight at the engines",
            "ttft": "wall-clock ms at the client; engine durations are modelled seconds / time_scale",
            "machine": {"before": before, "after": machine_load()},
        },
        "details": {
            **{
                name: {**router_detail(run), "engine_share": shares.get(name)} for name, run in pooled.items()
            },
            "prefixfleet_routing_decisions": decisions,
            "added_latency": latency["detail"],
        },
        "acceptance": acceptance(routers, latency["added"]),
    }
    return report, {name: ttfts_ms(run.outcomes) for name, run in pooled.items()}


def acceptance(routers: dict[str, Any], added: dict[str, float]) -> dict[str, Any]:
    """Issue 3's targets, evaluated on what was measured (never used to steer the measurement)."""
    ours, peer = routers.get("prefixfleet", {}), routers.get("sglang_cache_aware", {})
    out: dict[str, Any] = {"added_latency_p50_le_2ms": added["p50"] <= 2.0}
    if "p99_ttft_ms" in ours and "p99_ttft_ms" in peer and peer["p99_ttft_ms"] > 0:
        ratio = ours["p99_ttft_ms"] / peer["p99_ttft_ms"]
        out["p99_ratio_vs_sglang"] = ratio
        out["p99_le_0.8x_sglang"] = ratio <= 0.8
        out["hit_rate_ge_sglang"] = ours["hit_rate"] >= peer["hit_rate"]
    return out


def format_compare(report: dict[str, Any]) -> str:
    s = report["settings"]
    rows = {}
    for name, row in report["routers"].items():
        if "skipped" in row:
            continue
        detail = report["details"].get(name, {})
        rows[name] = {**row, "p50_ttft_ms": detail.get("p50_ttft_ms")}
    lines = [
        f"{report['workload']}: {counted(s['requests'], 'request')} × {counted(s['repeats'], 'round')}, "
        f"{counted(s['replicas'], 'engine')} × {s['engine']['cache_tokens']} cache tokens, "
        f"time-scale {s['engine']['time_scale']} (TTFT wall-clock ms)",
        format_table(rows, title="router"),
    ]
    for name, row in report["routers"].items():
        if "skipped" in row:
            lines.append(f"{name}: skipped ({row['skipped']})")
    lat, d = report["added_latency_ms"], report["details"]["added_latency"]
    lines.append(
        f"gateway added latency at {d['rate_rps_per_path']:.0f} req/s: p50 {lat['p50']:+.2f} ms, "
        f"p99 {lat['p99']:+.2f} ms  (gateway p50/p99 {d['gateway_p50_ms']:.2f}/{d['gateway_p99_ms']:.2f} ms, "
        f"direct {d['direct_p50_ms']:.2f}/{d['direct_p99_ms']:.2f} ms); one request at a time: "
        f"p50 {d['one_at_a_time_added_p50_ms']:+.2f} ms"
    )
    acc = report["acceptance"]
    if "p99_ratio_vs_sglang" in acc:
        lines.append(
            f"p99 TTFT vs sglang-router: {acc['p99_ratio_vs_sglang']:.2f}x (target <= 0.8); "
            f"hit rate >= sglang: {acc['hit_rate_ge_sglang']}; "
            f"added p50 <= 2 ms: {acc['added_latency_p50_le_2ms']}"
        )
    return "\n".join(lines)
