"""The sidecar reads its engine's ``/metrics`` as text even where the engine would compress it.

SGLang mounts prometheus_client's ``make_asgi_app`` at ``/metrics`` (``add_prometheus_middleware``)
and so did vLLM before it served them through prometheus-fastapi-instrumentator
(``mount_metrics``): that app gzips its answer whenever the request's ``Accept-Encoding`` names
gzip (prometheus_client ``_bake_output``). aiohttp asks for ``gzip, deflate`` by default and the
sidecar's session does not decompress (``auto_decompress=False``, as it proxies bytes), so it read
gzip bytes: a vLLM engine's ``vllm:cache_config_info`` was "not a Prometheus text exposition" (no
capacity, no block size), and the sidecar's own ``/metrics`` (the engine's followed by its own)
served those bytes unlabelled, a scrape Prometheus and the autoscaler's fallback cannot parse.

The engine here answers ``/metrics`` with prometheus_client's own encoder, as ``make_asgi_app`` does.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, serve_aiohttp, standalone_sidecar
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import _bake_output
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router import sidecar as sidecar_module

pytestmark = pytest.mark.timeout(60)


def prometheus_engine() -> web.Application:
    registry = CollectorRegistry()
    info = Gauge(
        "vllm:cache_config_info",
        "cache config",
        ["block_size", "engine", "num_gpu_blocks"],
        registry=registry,
    )
    info.labels("32", "0", "100").set(1)

    async def metrics(request: web.Request) -> web.Response:
        # what prometheus_client's make_asgi_app answers (the encoding follows Accept-Encoding)
        status, headers, body = _bake_output(
            registry, request.headers.get("Accept", ""), request.headers.get("Accept-Encoding", ""), {}, False
        )
        return web.Response(status=int(status.split()[0]), body=body, headers=dict(headers))

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "served", "object": "model"}]})

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    for path, handler in {"/metrics": metrics, "/v1/models": models, "/health": health}.items():
        app.router.add_get(path, handler)
    return app


async def test_a_compressing_engines_metrics_are_read_and_reexposed_as_text() -> None:
    async with serve_aiohttp(prometheus_engine()) as engine_url:
        config = standalone_sidecar(
            engine_url, model=None, revision=None, cache_tokens=None, engine_api="vllm"
        )
        async with sidecar_module.listening(config) as served, aiohttp.ClientSession() as http:
            car = served.sidecar
            await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
            assert (car.s.engine.match_unit, car.s.mirror.block_tokens) == (32, 32)
            assert car.s.mirror.tree.capacity_tokens == 32 * 100
            async with http.get(f"http://127.0.0.1:{served.port}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
            names = {f.name for f in text_string_to_metric_families(text)}
            assert "vllm:cache_config_info" in names  # the engine's part
            assert any(n.startswith("prefixfleet_sidecar_") for n in names)  # and the sidecar's own
