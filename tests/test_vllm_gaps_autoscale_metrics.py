"""The operator's autoscaler reads the series of the API an engine speaks, not of its kind.

A ``kind: emulator`` fleet whose ``spec.engine.args`` say ``--api vllm`` runs emulators with vLLM's
API, which export vLLM's series (``vllm:prefix_cache_queries_total``...), not SGLang's. The
autoscaler picked the names by kind (emulator -> SGLang's), so such a fleet's engine rates were
never found: its prefill load read 0 and it never scaled up for it. The names now come from the one
decision of the API (``planner.sidecar_engine_api``, which also tells the sidecar).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from prefixfleet.operator import models
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    _read_engines,
)
from prefixfleet.operator.autoscale_observe import (
    ENGINE_METRICS,
    SGLANG_METRICS,
    VLLM_METRICS,
    engine_metric_names,
)
from prefixfleet.operator.planner import FleetRef, sidecar_engine_api

SPEC_BASE = {"model": {"name": "emulated-llm"}, "replicas": 1, "redis": {"url": "redis://127.0.0.1:1"}}


@pytest.mark.parametrize(
    ("kind", "args", "expected"),
    [
        ("emulator", [], SGLANG_METRICS),
        ("emulator", ["--api", "vllm"], VLLM_METRICS),
        ("emulator", ["--api=vllm"], VLLM_METRICS),
        ("emulator", ["--api", "vllm", "--api", "sglang"], SGLANG_METRICS),  # the last one wins
        ("sglang", [], SGLANG_METRICS),
        ("vllm", [], VLLM_METRICS),
        ("sglang", ["--api", "vllm"], SGLANG_METRICS),  # --api is the emulator's flag only
    ],
)
def test_the_names_follow_the_api_the_sidecar_is_told(
    kind: models.EngineKind, args: list[str], expected: object
) -> None:
    assert engine_metric_names(kind, args) == expected
    # one decision: the sidecar's --engine-api and the series agree
    assert (expected is VLLM_METRICS) == (sidecar_engine_api(kind, args) == "vllm")


def test_each_kind_without_args_keeps_its_series() -> None:
    assert ENGINE_METRICS == {"sglang": SGLANG_METRICS, "emulator": SGLANG_METRICS, "vllm": VLLM_METRICS}


@pytest.fixture
async def vllm_sidecar() -> AsyncIterator[tuple[str, Counter, Counter]]:
    """A sidecar's /metrics in front of a vLLM-API engine: vllm:* series only, made by
    prometheus_client as vLLM makes them (labelled model_name); its two counters to advance."""
    registry = CollectorRegistry()
    queries = Counter("vllm:prefix_cache_queries", "tokens looked up", ["model_name"], registry=registry)
    hits = Counter("vllm:prefix_cache_hits", "tokens found", ["model_name"], registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry)
    queries.labels("m").inc(1000)
    hits.labels("m").inc(250)
    waiting.labels("m").set(2)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serve_aiohttp(app) as url:
        yield url, queries, hits


@pytest.mark.parametrize("args", [["--api", "vllm"], ["--api=vllm", "--block-size", "16"]])
async def test_an_emulator_fleet_in_vllm_mode_has_engine_rates(
    vllm_sidecar: tuple[str, Counter, Counter], args: list[str]
) -> None:
    url, queries, hits = vllm_sidecar
    spec = models.validate_spec({**SPEC_BASE, "engine": {"kind": "emulator", "args": args}})
    ref = FleetRef(name="chat", namespace="prod")
    state = FleetAutoscale()
    logger = logging.getLogger("test.vllm_gaps")
    async with httpx.AsyncClient(timeout=5.0) as http:
        auto = AutoscaleContext(OperatorMetrics(), http)
        first = await _read_engines(auto, state, spec, ref, {"chat-0": url}, logger)
        # before, the SGLang names found nothing in the scrape: no counters at all
        assert first.counters["chat-0"].uncached_tokens == 750.0, first
        queries.labels("m").inc(2000)  # 2000 more tokens asked for, 1000 of them cached
        hits.labels("m").inc(1000)
        second = await _read_engines(auto, state, spec, ref, {"chat-0": url}, logger)
    rates = second.rates["chat-0"]
    seconds = second.counters["chat-0"].at_s - first.counters["chat-0"].at_s
    assert rates.uncached_tokens_per_s == pytest.approx(1000.0 / seconds)
    assert rates.queue_reqs == 2.0 and second.source == "scrape"
