"""A request that makes its engine break off (crash, reset) after taking it: a query of death.

Specification: a failure before the request could reach the upstream (connection refused, DNS,
connect timeout) is safe to re-send to another worker, and still is; one after the upstream took it
(the connection reset or closed mid-request) is not — the same prompt would take down the next
replica, and an LLM request is not idempotent in cost. The sidecar says which: its 502 carries
``X-Prefixfleet-Retryable: 1`` when the engine never got the request and ``received`` when it did.
The gateway re-sends a received failure at most ``resends_after_receipt`` times (default 1; 0: never),
and treats its own connection to a worker the same way. Before, every such failure was re-sent up to
``--max-retries`` times: a stand-in engine that aborts one prompt was hit on every worker.

Real HTTP on 127.0.0.1: stand-in engines (aiohttp), in-process sidecars (no Redis) as static workers
of an in-process gateway. The poisoned request goes first, on fresh connections, so the upstream
client's one re-send of a request on a stale keep-alive connection does not enter the counts.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import free_port, serve_aiohttp

from prefixfleet.router.gateway import GatewayConfig, listening
from prefixfleet.router.sidecar import SidecarConfig
from prefixfleet.router.sidecar import listening as sidecar_listening

pytestmark = pytest.mark.timeout(60)
POISON = "poison-pill"


class Engines:
    """Stand-in engines sharing one tally: a prompt with :data:`POISON` has its connection aborted
    (the engine died of it), any other is answered."""

    def __init__(self) -> None:
        self.poisoned: list[str] = []  # the engine URL of each poisoned request received
        self.served = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if POISON in body["prompt"]:
            self.poisoned.append(f"http://{request.host}")
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        self.served += 1
        if body.get("stream"):
            events = b'data: {"choices": [{"text": "ok"}]}\n\ndata: [DONE]\n\n'
            return web.Response(body=events, content_type="text/event-stream")
        return web.json_response({"choices": [{"text": "ok"}], "usage": {}})

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        return app


async def sidecar_over(stack: contextlib.AsyncExitStack, engine_url: str, name: str) -> str:
    """A sidecar in front of ``engine_url`` for the life of ``stack``: its URL."""
    port = free_port()
    config = SidecarConfig(
        engine_url=engine_url,
        redis_url=None,
        port=port,
        worker_id=name,
        model="m",
        revision="r",
        cache_tokens=20000,
        prefill_tokens_per_s=30000.0,
    )
    await stack.enter_async_context(sidecar_listening(config))
    return f"http://127.0.0.1:{port}"


@asynccontextmanager
async def fleet(engines: Engines, replicas: int, **gateway: object) -> AsyncIterator[str]:
    """``replicas`` stand-in engines, each behind its sidecar, behind one gateway: its URL."""
    async with contextlib.AsyncExitStack() as stack:
        workers = []
        for i in range(replicas):
            engine_url = await stack.enter_async_context(serve_aiohttp(engines.app()))
            workers.append(await sidecar_over(stack, engine_url, f"w{i}"))
        config = GatewayConfig(port=0, workers=tuple(workers), policy="round_robin", max_retries=3, **gateway)
        served = await stack.enter_async_context(listening(config))
        yield f"http://127.0.0.1:{served.port}"


async def post(
    http: aiohttp.ClientSession, url: str, prompt: str, *, stream: bool = False
) -> tuple[int, str]:
    body = {"prompt": prompt, "max_tokens": 2, "stream": stream}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        return resp.status, await resp.text()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_that_kills_its_engine_is_not_re_sent_when_resends_are_off(stream: bool) -> None:
    engines = Engines()
    async with fleet(engines, 4, resends_after_receipt=0) as gateway, aiohttp.ClientSession() as http:
        status, text = await post(http, gateway, f"{POISON} now", stream=stream)
        assert status == 502, text
        assert "may have received the request; not re-sent" in json.loads(text)["error"]["message"]
        assert len(engines.poisoned) == 1, engines.poisoned  # before: every worker's engine was hit
        # the other workers are unaffected
        for i in range(8):
            assert (await post(http, gateway, f"hello {i}", stream=stream))[0] == 200
        assert engines.served == 8


async def test_by_default_a_received_failure_is_re_sent_once_and_no_more() -> None:
    """One re-send keeps an engine's unrelated death from failing its in-flight requests; a prompt
    that kills engines takes down two of them, not ``--max-retries`` + 1."""
    engines = Engines()
    async with fleet(engines, 4) as gateway, aiohttp.ClientSession() as http:
        status, text = await post(http, gateway, f"{POISON} again")
        assert status == 502, text
        assert len(engines.poisoned) == 2 and len(set(engines.poisoned)) == 2, engines.poisoned
        for i in range(4):
            assert (await post(http, gateway, f"hello {i}"))[0] == 200


async def test_the_sidecar_says_whether_its_engine_received_the_request() -> None:
    engines = Engines()
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        engine_url = await stack.enter_async_context(serve_aiohttp(engines.app()))
        live = await sidecar_over(stack, engine_url, "live")
        gone = await sidecar_over(stack, f"http://127.0.0.1:{free_port()}", "gone")
        body = {"prompt": f"{POISON} here", "max_tokens": 2}
        async with http.post(f"{live}/v1/completions", json=body) as resp:
            assert resp.status == 502
            assert resp.headers["X-Prefixfleet-Retryable"] == "received"
        async with http.post(f"{gone}/v1/completions", json=body) as resp:
            assert resp.status == 502
            assert resp.headers["X-Prefixfleet-Retryable"] == "1"  # refused: it never got it


async def test_a_worker_whose_engine_is_unreachable_is_still_skipped_for_another() -> None:
    engines = Engines()
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        engine_url = await stack.enter_async_context(serve_aiohttp(engines.app()))
        gone = await sidecar_over(stack, f"http://127.0.0.1:{free_port()}", "gone")
        live = await sidecar_over(stack, engine_url, "live")
        config = GatewayConfig(port=0, workers=(gone, live), policy="round_robin", resends_after_receipt=0)
        served = await stack.enter_async_context(listening(config))
        for i in range(4):
            status, text = await post(http, f"http://127.0.0.1:{served.port}", f"hello {i}")
            assert status == 200, text
        assert engines.served == 4


class ResettingWorker:
    """A worker the gateway talks to directly: it reads each request and then aborts the connection."""

    def __init__(self) -> None:
        self.hits = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.hits += 1
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", Engines().health)
        return app


async def test_the_gateways_own_connection_reset_after_sending_is_not_re_sent_but_a_refusal_is() -> None:
    resetting = [ResettingWorker() for _ in range(3)]
    engines = Engines()
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        urls = [await stack.enter_async_context(serve_aiohttp(w.app())) for w in resetting]
        good = await stack.enter_async_context(serve_aiohttp(engines.app()))
        config = GatewayConfig(port=0, workers=tuple(urls), policy="round_robin", resends_after_receipt=0)
        served = await stack.enter_async_context(listening(config))
        status, text = await post(http, f"http://127.0.0.1:{served.port}", "hello")
        assert status == 502, text
        assert sum(w.hits for w in resetting) == 1  # before: 3 (each worker once)
        refused = f"http://127.0.0.1:{free_port()}"
        config = GatewayConfig(port=0, workers=(refused, good), policy="round_robin", resends_after_receipt=0)
        served = await stack.enter_async_context(listening(config))
        for i in range(2):
            status, text = await post(http, f"http://127.0.0.1:{served.port}", f"hello {i}")
            assert status == 200, text
