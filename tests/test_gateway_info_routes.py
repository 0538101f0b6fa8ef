"""The read-only engine routes SGLang and OpenAI clients call before generating, through the gateway.

Specification: ``GET /v1/models/{model}`` (the OpenAI SDK's ``client.models.retrieve``),
``/get_model_info`` and ``/model_info`` (SGLang's frontend ``RuntimeEndpoint`` reads it when it is
created), ``/get_server_info`` and ``/server_info`` are answered by a live worker, as ``/v1/models``
is: the client's headers and query string passed on, the worker named in ``X-Prefixfleet-Worker``,
503 with ``Retry-After`` when no worker is routable. Before, each was the gateway's own 404 ("no
endpoint"): ``models.retrieve`` reported a served model as missing, and ``RuntimeEndpoint`` could
not start. The request counter labels a model's route by its template, never by the model in the
path (a scanner cannot grow the series).

Real HTTP on 127.0.0.1: a stand-in engine (aiohttp) as the static worker of a gateway in this process.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.router.gateway import GatewayConfig, listening

pytestmark = pytest.mark.timeout(60)

ROUTES = ("/v1/models/some-model", "/get_model_info", "/model_info", "/get_server_info", "/server_info")


async def echo(request: web.Request) -> web.Response:
    return web.json_response({"path": request.path_qs, "auth": request.headers.get("Authorization")})


def engine_app() -> web.Application:
    app = web.Application()
    for path in (*ROUTES, "/health"):
        app.router.add_get(path, echo)
    return app


async def test_info_routes_are_answered_by_a_worker() -> None:
    async with (
        serve_aiohttp(engine_app()) as engine,
        listening(GatewayConfig(port=0, workers=(engine,))) as served,
        aiohttp.ClientSession() as session,
    ):
        gateway = f"http://127.0.0.1:{served.port}"
        for route in ROUTES:
            async with session.get(f"{gateway}{route}?x=1", headers={"Authorization": "Bearer k"}) as resp:
                assert resp.status == 200, (route, await resp.text())
                assert await resp.json() == {"path": f"{route}?x=1", "auth": "Bearer k"}
                assert resp.headers["X-Prefixfleet-Worker"] == engine
        for i in range(5):  # models a scanner makes up
            async with session.get(f"{gateway}/v1/models/made-up-{i}") as resp:
                assert resp.status == 404  # the engine's answer
        async with session.get(f"{gateway}/metrics") as resp:
            metrics = await resp.text()
    endpoints = {
        line.split('endpoint="', 1)[1].split('"', 1)[0]
        for line in metrics.splitlines()
        if line.startswith("prefixfleet_gateway_requests_total{")
    }
    assert "made-up-0" not in metrics
    assert endpoints == {"/v1/models/{model}", *ROUTES[1:]}


async def test_with_no_worker_an_info_route_is_a_503_with_retry_after() -> None:
    async with (
        listening(GatewayConfig(port=0, workers=("http://127.0.0.1:1",))) as served,
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{served.port}/get_model_info") as resp,
    ):
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "2"
        assert (await resp.json())["error"]["type"] == "service_unavailable"
