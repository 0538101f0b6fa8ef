"""vLLM's tokenizer and version routes through the gateway (and SGLang's tokenizer routes).

vLLM serves ``POST /tokenize``, ``POST /detokenize`` and ``GET /version`` (checked in the stored
vllm-project/vllm vllm/entrypoints/openai/api_server.py); SGLang serves ``POST /tokenize``,
``/detokenize`` and the same under ``/v1`` (sgl-project/sglang
python/sglang/srt/entrypoints/http_server.py). The gateway proxied a fixed set of GET info routes
only, so each was its own 404 ("no endpoint"). Specification: each is answered by a live worker as
``/v1/models`` is: the client's body, query and headers passed on, the worker named in
``X-Prefixfleet-Worker``, the answer the engine's own (the same bytes as asking it directly).

Real processes: ``prefixfleet emulator --api vllm`` behind ``router sidecar --engine-api vllm`` and
a gateway (the local fleet's); and an in-process gateway in front of a stand-in engine for the
``/v1`` forms the emulator does not serve.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.router.gateway import GatewayConfig, listening
from prefixfleet.router.proxying import WORKER_HEADER
from prefixfleet.tokenizer import tokenize

PROMPT = "the invoice for order seven was paid twice and the refund never came"


@pytest.fixture
async def vllm_fleet(tmp_path: Path) -> AsyncIterator[LocalFleet]:
    async with Supervisor(tmp_path) as sup:
        engine = EngineSettings(cache_tokens=16_000, prefill_tokens_per_s=4000, api="vllm")
        fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=1, engine=engine))
        await fleet.start_engines()
        await fleet.start_gateways("queue_aware")
        yield fleet


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_vllm_tokenizer_and_version_routes_through_the_gateway(vllm_fleet: LocalFleet) -> None:
    gateway, engine = vllm_fleet.gateway_urls[0], vllm_fleet.engine_urls[0]
    worker = vllm_fleet.replicas[0].worker_id
    async with httpx.AsyncClient(timeout=30) as http:
        model = (await http.get(f"{engine}/v1/models")).json()["data"][0]["id"]
        asks = [
            ("POST", "/tokenize", {"model": model, "prompt": PROMPT}),
            ("GET", "/version", None),
        ]
        answers = {}
        for method, path, body in asks:
            direct = await http.request(method, f"{engine}{path}", json=body)
            through = await http.request(method, f"{gateway}{path}", json=body)
            assert through.status_code == 200, (path, through.status_code, through.text)
            assert through.json() == direct.json(), path
            assert through.headers[WORKER_HEADER] == worker, through.headers
            answers[path] = through.json()
        assert answers["/tokenize"]["tokens"] == list(tokenize(PROMPT))
        assert answers["/tokenize"]["count"] == len(tokenize(PROMPT))
        assert answers["/version"]["version"]

        tokens = answers["/tokenize"]["tokens"]
        resp = await http.post(f"{gateway}/detokenize", json={"model": model, "tokens": tokens})
        assert resp.status_code == 200, resp.text
        assert resp.json()["prompt"] == PROMPT  # words this engine tokenized come back as they were

        # the engine's refusal is passed on as it is (a 4xx is an answer, not a reason to ask another)
        bad = await http.post(f"{gateway}/tokenize", json={"model": model})
        direct_bad = await http.post(f"{engine}/tokenize", json={"model": model})
        assert (bad.status_code, bad.json()) == (direct_bad.status_code, direct_bad.json())
        assert 400 <= bad.status_code < 500


def stand_in_engine(seen: list[tuple[str, str, bytes, str | None]]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((request.method, request.path_qs, body, request.headers.get("Content-Type")))
        return web.json_response({"path": request.path_qs, "body": body.decode()})

    app = web.Application()
    for path in ("/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize"):
        app.router.add_post(path, echo)
    app.router.add_get("/version", echo)
    app.router.add_get("/health", echo)
    return app


@pytest.mark.timeout(60)
async def test_sglangs_v1_tokenizer_routes_are_passed_on_with_their_body() -> None:
    seen: list[tuple[str, str, bytes, str | None]] = []
    async with (
        serve_aiohttp(stand_in_engine(seen)) as engine,
        listening(GatewayConfig(port=0, workers=(engine,))) as served,
        aiohttp.ClientSession() as session,
    ):
        gateway = f"http://127.0.0.1:{served.port}"
        for path in ("/v1/tokenize", "/v1/detokenize", "/tokenize", "/detokenize"):
            body = b'{"prompt": "hello world"}'
            headers = {"Content-Type": "application/json"}
            async with session.post(f"{gateway}{path}?x=1", data=body, headers=headers) as resp:
                assert resp.status == 200, (path, await resp.text())
                assert await resp.json() == {"path": f"{path}?x=1", "body": body.decode()}
                assert resp.headers[WORKER_HEADER] == engine
            assert seen[-1] == ("POST", f"{path}?x=1", body, "application/json")
        async with session.get(f"{gateway}/tokenize") as resp:
            assert resp.status == 405  # a tokenizer route is POST, as on the engines
        async with session.get(f"{gateway}/metrics") as resp:
            metrics = await resp.text()
    assert 'endpoint="/v1/tokenize"' in metrics
