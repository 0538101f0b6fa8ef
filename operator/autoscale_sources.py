"""Where the autoscaler's observations come from (thin I/O shared by the operator and the local fleet):
each worker's load record and summary from Redis, decoded with the data plane's own code, and each
engine's token rates from Prometheus when one is configured, else (and for every replica Prometheus
does not cover this round) from its sidecar's ``/metrics``. Malformed or missing records are skipped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence

import httpx
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, decode_load
from prefixfleet.router.summary import Summary, SummaryError, decode_summary

from .autoscale import FleetObservation, ReplicaObservation
from .autoscale_observe import (
    SGLANG_METRICS,
    EngineMetricNames,
    EngineRates,
    EngineReading,
    TokenCounters,
    engine_reading,
    observe_fleet,
    parse_token_counters,
)
from .planner import ObservedPod
from .prometheus_source import PrometheusScope, PrometheusSource, PrometheusUnavailable


async def read_records(
    redis: aioredis.Redis, keys: FleetKeys, names: Sequence[str]
) -> tuple[dict[str, LoadReport], dict[str, Summary]]:
    if not names:
        return {}, {}
    # one round trip for both records of every worker
    raw = await redis.mget([keys.load(n) for n in names] + [keys.summary(n) for n in names])
    raw_loads, raw_summaries = raw[: len(names)], raw[len(names) :]
    loads: dict[str, LoadReport] = {}
    summaries: dict[str, Summary] = {}
    for n, raw_load, raw_summary in zip(names, raw_loads, raw_summaries, strict=True):
        with contextlib.suppress(SummaryError, ValueError):
            if raw_load is not None:
                loads[n] = decode_load(raw_load)
        with contextlib.suppress(SummaryError, ValueError):
            if raw_summary is not None:
                summaries[n] = decode_summary(raw_summary)
    return loads, summaries


async def replicas_now(
    redis: aioredis.Redis, keys: FleetKeys, pods: Sequence[ObservedPod], last: FleetObservation | None
) -> Sequence[ReplicaObservation]:
    """The replicas' waits from their load records now, as a new replica arrives (warm_on_arrival):
    the last round may be an interval old, and in a ramp the fleet saturates within seconds. The
    ``last`` round's view if Redis does not answer."""
    try:
        loads, _ = await read_records(redis, keys, [p.name for p in pods])
    except (RedisError, OSError):
        return last.replicas if last is not None else ()
    return observe_fleet(time.time(), 0, pods, loads, {}, ()).replicas


async def scrape_counters(
    http: httpx.AsyncClient, urls: Mapping[str, str], names: EngineMetricNames = SGLANG_METRICS
) -> dict[str, TokenCounters]:
    async def one(url: str) -> TokenCounters | None:
        try:
            resp = await http.get(f"{url}/metrics")
        except httpx.HTTPError:
            return None
        return parse_token_counters(resp.text, time.time(), names) if resp.status_code == 200 else None

    pods = list(urls)
    results = await asyncio.gather(*(one(urls[n]) for n in pods))
    return {n: c for n, c in zip(pods, results, strict=True) if c is not None}


async def read_engine_metrics(
    http: httpx.AsyncClient,
    urls: Mapping[str, str],
    previous: Mapping[str, TokenCounters],
    prometheus: PrometheusSource | None = None,
    scope: PrometheusScope | None = None,
    last_rates: Mapping[str, EngineRates] | None = None,
) -> EngineReading:
    """Engine rates for the replicas in ``urls`` (name -> sidecar URL): Prometheus first, the
    sidecars' ``/metrics`` for whatever it did not answer. Never raises for an unreachable source."""
    rates: dict[str, EngineRates] | None = None
    problem = ""
    if prometheus is not None and scope is not None:
        try:
            rates = await prometheus.engine_rates(scope)
        except PrometheusUnavailable as exc:
            problem = str(exc) or "unavailable"
    missing = {n: u for n, u in urls.items() if rates is None or n not in rates}
    names = scope.metrics if scope is not None else SGLANG_METRICS
    scraped = await scrape_counters(http, missing, names) if missing else {}
    return engine_reading(
        list(urls),
        previous,
        scraped,
        prometheus_url=prometheus.display_url if prometheus is not None and scope is not None else None,
        prometheus_rates=rates,
        prometheus_problem=problem,
        last_rates=last_rates,
    )
