"""Hop-by-hop headers stay on their hop, through the gateway (and the sidecar, same code).

Specification (RFC 9110 §7.6.1): a header the message's ``Connection`` header names is meant for
that connection only, and a proxy removes it, both ways; so is ``Proxy-Connection`` (the legacy
name some clients still send). Before, ``Connection: keep-alive, X-Hop`` had the gateway drop the
Connection header and forward ``X-Hop`` to the worker, and an engine's ``Connection``-named answer
header reached the client. End-to-end headers (``Authorization``, a request id) and the query
string still go through.

Real HTTP on 127.0.0.1: a stand-in engine (aiohttp) recording what it received, as the static
worker of a gateway in this process.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp
from multidict import CIMultiDict

from prefixfleet.router.gateway import GatewayConfig, listening
from prefixfleet.router.proxying import answer_headers, forward_header_pairs

pytestmark = pytest.mark.timeout(60)


def test_headers_the_connection_header_names_are_not_forwarded() -> None:
    sent = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Hop"),
            ("connection", " x-other-hop ,"),  # a second line, other case and spacing
            ("X-Hop", "1"),
            ("X-Other-Hop", "2"),
            ("Proxy-Connection", "keep-alive"),
            ("Authorization", "Bearer k"),
            ("X-Request-Id", "r1"),
        ]
    )
    assert forward_header_pairs(sent) == [("Authorization", "Bearer k"), ("X-Request-Id", "r1")]
    answered = CIMultiDict([("Connection", "X-Hop"), ("X-Hop", "1"), ("Content-Type", "application/json")])
    assert list(answer_headers(answered).items()) == [("Content-Type", "application/json")]


async def test_through_the_gateway_only_end_to_end_headers_reach_the_engine() -> None:
    received: list[tuple[str, CIMultiDict[str]]] = []

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        received.append((request.path_qs, CIMultiDict(request.headers)))
        return web.json_response({"choices": [{"text": "ok"}], "usage": {}})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    async with (
        serve_aiohttp(app) as engine,
        listening(GatewayConfig(port=0, workers=(engine,))) as served,
        aiohttp.ClientSession() as session,
    ):
        headers = {
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "secret of this hop",
            "Proxy-Connection": "keep-alive",
            "Authorization": "Bearer key",
            "X-Request-Id": "abc",
        }
        gateway = f"http://127.0.0.1:{served.port}"
        async with session.post(
            f"{gateway}/v1/completions?trace=1", json={"prompt": "hi", "max_tokens": 1}, headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
    [(path_qs, seen)] = received
    assert path_qs == "/v1/completions?trace=1"
    assert "X-Hop" not in seen and "Proxy-Connection" not in seen, seen
    assert seen["Authorization"] == "Bearer key" and seen["X-Request-Id"] == "abc"
    assert seen["Host"] == engine.removeprefix("http://")  # the worker's, not the gateway's
