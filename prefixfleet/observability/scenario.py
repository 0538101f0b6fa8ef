"""A small observed run: a local fleet under load, scraped by a real Prometheus, with fleet events.

Used by the live observability test and to draw the docs' pictures::

    python -m prefixfleet.observability.scenario --requests 3000 --rate 40 --out docs/img

Phases, under continuous load, so every dashboard panel and annotation has something to show:
(1) both replicas serve tenant traffic with shared prefixes; (2) replica-1 is put in ``warming`` (as
during a pre-warm) and back to ``ready`` after ``event_hold_s``; (3) replica-1 is ``draining``, and
after ``event_hold_s`` its sidecar stops (a scale-down) and replica-0 serves the rest alone.
Prometheus keeps running after the fleet stopped (its TSDB holds the run), so queries are made over
``[start, end]`` of the returned :class:`ObservedRun`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from prefixfleet.fleet.load import LoadRequest, run_load
from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet
from prefixfleet.fleet.processes import Supervisor

from .dashboard import ALERTS
from .local_prometheus import (
    LocalPrometheus,
    PrometheusNotFound,
    ScrapeTarget,
    prometheus_binary,
    scrape_config,
)

NAMESPACE = "local"


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    fleet: str = "observed"
    requests: int = 300
    rate_rps: float = 40.0
    tenants: int = 6
    prefix_words: int = 300  # shared per tenant: the cacheable part
    suffix_words: int = 40
    max_tokens: int = 8
    time_scale: float = 10.0
    prefill_tokens_per_s: float = 3000.0  # modelled: slow enough that uncached prefill shows in TTFT
    scrape_interval_s: float = 1.0
    event_hold_s: float = 2.5  # how long replica-1 stays warming / draining
    seed: int = 7


@dataclass(frozen=True, slots=True)
class ObservedRun:
    start: float  # unix seconds, first request
    end: float  # unix seconds, after the last scrape of the last phase
    fleet: str
    namespace: str
    completed: int
    errors: int


def tenant_requests(spec: ScenarioSpec) -> list[LoadRequest]:
    """Zipf-ish tenants: each prompt = the tenant's shared prefix + a unique question."""
    rng = random.Random(spec.seed)
    weights = [1.0 / (i + 1) for i in range(spec.tenants)]
    prefixes = [" ".join(f"tenant{t}word{j}" for j in range(spec.prefix_words)) for t in range(spec.tenants)]
    out = []
    for i in range(spec.requests):
        tenant = rng.choices(range(spec.tenants), weights)[0]
        question = " ".join(f"q{i}w{j}" for j in range(spec.suffix_words))
        out.append(
            LoadRequest(
                arrival_s=i / spec.rate_rps,
                prompt=f"{prefixes[tenant]} {question}",
                prompt_tokens=spec.prefix_words + spec.suffix_words,
                max_tokens=spec.max_tokens,
                group=tenant,
            )
        )
    return out


async def _set_state(session: aiohttp.ClientSession, sidecar_url: str, state: str) -> None:
    async with session.post(f"{sidecar_url}/prefixfleet/state", json={"state": state}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"sidecar {sidecar_url} refused state {state}: HTTP {resp.status}")


async def _wait_for_view_size(gateways: list[str], workers: int, timeout_s: float = 15.0) -> None:
    """Until every gateway's view holds ``workers`` workers (the scale-down reached the gateways)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        for url in gateways:
            while True:
                async with session.get(f"{url}/health") as resp:
                    body = await resp.json(content_type=None)
                if body.get("workers") == workers:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway {url} sees {body.get('workers')} workers, not {workers}")
                await asyncio.sleep(0.1)


def observed_prometheus(
    directory: Path, port: int, targets: Sequence[ScrapeTarget], spec: ScenarioSpec
) -> LocalPrometheus:
    """The scenario's Prometheus (not started yet): scrapes ``targets`` with the package's alert rules."""
    config = scrape_config(
        targets, fleet=spec.fleet, namespace=NAMESPACE, interval_s=spec.scrape_interval_s, rule_files=[ALERTS]
    )
    directory.mkdir(parents=True, exist_ok=True)
    return LocalPrometheus(directory, port, config)


async def run_scenario(
    spec: ScenarioSpec, run_dir: Path, prometheus_port: int, *, progress: bool = False
) -> tuple[LocalPrometheus, ObservedRun]:
    """Run the fleet scenario; return the still-running Prometheus (caller stops it) and the window."""
    engine = EngineSettings(
        time_scale=spec.time_scale, prefill_tokens_per_s=spec.prefill_tokens_per_s, cache_tokens=50_000
    )
    fleet_spec = FleetSpec(replicas=2, gateways=1, engine=engine, fleet_name=spec.fleet)
    requests = tenant_requests(spec)
    prometheus_binary()  # PrometheusNotFound now, not once the fleet has started
    cut_a, cut_b = int(len(requests) * 0.4), int(len(requests) * 0.7)
    prometheus: LocalPrometheus | None = None
    async with Supervisor(run_dir / "fleet") as sup:
        fleet = LocalFleet(sup, fleet_spec)
        await fleet.start_engines()
        await fleet.start_gateways("queue_aware")
        targets = [
            ScrapeTarget("prefixfleet-gateway", url, f"gateway-{i}")
            for i, url in enumerate(fleet.gateway_urls)
        ]
        targets += [
            ScrapeTarget("prefixfleet-replica", r.sidecar_url, r.worker_id)
            for r in fleet.replicas
            if r.sidecar_url
        ]
        prometheus = observed_prometheus(run_dir / "prometheus", prometheus_port, targets, spec)
        try:
            prometheus.start()
            await asyncio.sleep(2 * spec.scrape_interval_s)  # a baseline before the first request
            start = time.time()
            gateways = fleet.gateway_urls
            outcomes = []

            async def load(part: list[LoadRequest], desc: str) -> None:
                run = await run_load(part, gateways, concurrency=32, progress=progress, desc=desc)
                outcomes.extend(run.outcomes)

            replica_1 = fleet.replicas[1]
            sidecar_1 = replica_1.sidecar_url
            assert sidecar_1 is not None and replica_1.sidecar is not None
            stopping = replica_1.sidecar

            async def after_hold(action: Awaitable[None]) -> None:
                await asyncio.sleep(spec.event_hold_s)
                await action

            await load(requests[:cut_a], "both replicas")
            # a sidecar refuses a state change without the fleet's control token
            async with aiohttp.ClientSession(headers=await fleet.control_headers()) as session:
                await _set_state(session, sidecar_1, "warming")
                ready_again = _set_state(session, sidecar_1, "ready")
                await asyncio.gather(load(requests[cut_a:cut_b], "pre-warm"), after_hold(ready_again))
                await _set_state(session, sidecar_1, "draining")
            # scale-down after the drain: the sidecar deregisters while traffic goes on
            scale_down = sup.stop(stopping)
            await asyncio.gather(load(requests[cut_b:], "drain, scale-down"), after_hold(scale_down))
            replica_1.sidecar, replica_1.sidecar_url = None, None
            await _wait_for_view_size(gateways, 1)
            await asyncio.sleep(4 * spec.scrape_interval_s)  # let the last samples be scraped
            end = time.time()
        except BaseException:
            prometheus.stop()
            raise
    errors = sum(1 for o in outcomes if not o.ok)
    return prometheus, ObservedRun(start, end, spec.fleet, NAMESPACE, len(outcomes) - errors, errors)


def main(argv: list[str] | None = None) -> int:
    from prefixfleet.cli import main as prefixfleet_main
    from prefixfleet.fleet.processes import free_port

    parser = argparse.ArgumentParser(description="Run the observed-fleet scenario and render the report.")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second (wall clock)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the report's PNGs")
    parser.add_argument("--port", type=int, default=0, help="Prometheus port (0: a free one)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="emulator speed-up (1: real time)")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds replica-1 stays warming/draining")
    parser.add_argument("--rate-window", default="15s", help="rate() window of the report")
    parser.add_argument(
        "--keep-prometheus", action="store_true", help="leave Prometheus up (its data: the run) until Ctrl-C"
    )
    args = parser.parse_args(argv)
    # refused before anything starts: a bad number used to surface as a traceback (or after the fleet)
    if args.requests < 1:
        parser.error(f"--requests must be at least 1, got {args.requests}")
    for flag, value in (("--rate", args.rate), ("--time-scale", args.time_scale), ("--hold", args.hold)):
        if not (math.isfinite(value) and value > 0):
            parser.error(f"{flag} must be a positive number, got {value:g}")
    try:
        prometheus_binary()  # before the fleet's ~20 s of start-up, not after them
    except PrometheusNotFound as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    spec = ScenarioSpec(
        requests=args.requests, rate_rps=args.rate, time_scale=args.time_scale, event_hold_s=args.hold
    )
    with tempfile.TemporaryDirectory(prefix="pf-observed-") as tmp:
        prometheus, run = asyncio.run(run_scenario(spec, Path(tmp), args.port or free_port(), progress=True))
        try:
            print(f"{run.completed} requests completed, {run.errors} errors, {run.end - run.start:.0f} s")
            # the pictures come from the report command itself, pointed at this run's Prometheus
            status = prefixfleet_main([
                "report", "--prometheus", prometheus.url,
                "--fleet", run.fleet, "--namespace", run.namespace,
                "--since", f"{math.ceil(run.end - run.start)}s", "--until", f"{run.end}",
                "--rate-window", args.rate_window, "--out", str(args.out),
            ])  # fmt: skip
            if args.keep_prometheus:
                print(f"Prometheus with the run's data: {prometheus.url} (Ctrl-C to stop)", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while prometheus.proc is not None and prometheus.proc.poll() is None:
                        time.sleep(1)
        finally:
            prometheus.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
