"""A worker answering 503 (the engine refused the request: queue full, not running) before any byte.

Specification: the gateway sends the request to another worker instead of handing the client the
503 while a healthy worker is there (before, every request routed to such a worker failed: half of
them with two workers), and the worker sits out like one that refused the connection. A 503 means
the engine did not take the request, so re-sending it is safe; the retries stay bounded (the busy
worker is asked once per request). With no other worker the client gets the gateway's own 503
(``Retry-After``, the engine's message named). A 500 is not re-sent: the engine may have run it.

Real HTTP on 127.0.0.1: stand-in engines (aiohttp) as static workers of a gateway in this process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.router import gateway as gateway_module
from prefixfleet.router.gateway import GatewayConfig, listening

pytestmark = pytest.mark.timeout(60)


class Engine:
    """Answers every completion with ``status`` (an OpenAI error body unless 200); health always ok."""

    def __init__(self, name: str, status: int) -> None:
        self.name = name
        self.status = status
        self.calls = 0

    async def completions(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        if self.status != 200:
            error = {"message": f"{self.name}: the request queue is full", "type": "x", "code": self.status}
            return web.json_response({"error": error}, status=self.status)
        return web.json_response({"choices": [{"text": self.name}], "usage": {}})

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        return app


@asynccontextmanager
async def gateway_over(*engines: Engine) -> AsyncIterator[str]:
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_aiohttp(engine.app())) for engine in engines]
        config = GatewayConfig(port=0, workers=tuple(urls), policy="round_robin")
        served = await stack.enter_async_context(listening(config))
        yield f"http://127.0.0.1:{served.port}"


async def retries_counted(session: aiohttp.ClientSession, gateway: str) -> float:
    async with session.get(f"{gateway}/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("prefixfleet_gateway_retries_total "))
    return float(line.split()[1])


async def test_a_503_before_any_byte_is_sent_to_another_worker() -> None:
    busy, good = Engine("busy", 503), Engine("good", 200)
    async with gateway_over(busy, good) as gateway, aiohttp.ClientSession() as session:
        for i in range(6):
            body = {"prompt": f"hello {i}", "max_tokens": 1, "stream": i % 2 == 1}
            async with session.post(f"{gateway}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["text"] == "good"
        assert busy.calls >= 1  # round robin sent it there at least once
        assert good.calls == 6
        assert await retries_counted(session, gateway) == busy.calls


async def test_with_no_other_worker_the_engines_503_reaches_the_client_as_it_came() -> None:
    busy = Engine("busy", 503)
    async with gateway_over(busy) as gateway, aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
            assert error["message"] == "busy: the request queue is full", error
            assert "Retry-After" not in resp.headers  # the engine's answer, not the gateway's own 503
        assert busy.calls == 1  # no retry storm on the only worker
        assert await retries_counted(session, gateway) == 0


async def test_a_500_is_not_sent_again() -> None:
    broken, good = Engine("broken", 500), Engine("good", 200)
    async with gateway_over(broken, good) as gateway, aiohttp.ClientSession() as session:
        statuses = []
        for i in range(2):
            async with session.post(f"{gateway}/v1/completions", json={"prompt": f"p{i}"}) as resp:
                statuses.append(resp.status)
        assert sorted(statuses) == [200, 500]
        assert broken.calls == 1 and good.calls == 1
        assert await retries_counted(session, gateway) == 0


async def test_a_fleet_refusing_work_is_asked_once_per_request_not_once_per_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the sit-out outlasts the test whatever the machine's load (the rule holds within it)
    monkeypatch.setattr(gateway_module, "SUSPECT_S", 600.0)
    engines = [Engine(f"busy{i}", 503) for i in range(3)]
    async with gateway_over(*engines) as gateway, aiohttp.ClientSession() as session:
        for i in range(3):
            async with session.post(f"{gateway}/v1/completions", json={"prompt": f"p{i}"}) as resp:
                assert resp.status == 503
        # the first request asked each engine once; the next ones only one each (every engine had
        # just refused): re-sending would multiply the load on an overloaded fleet
        assert sum(e.calls for e in engines) == 3 + 2
        assert all(e.calls >= 1 for e in engines)
