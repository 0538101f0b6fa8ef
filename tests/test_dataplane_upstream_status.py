"""An upstream answering a status outside 100..599 is a broken answer, not one to pass on.

Specification: llhttp reads any three digits as a status; HTTP defines 100..599 only. The proxies'
upstream client refuses such an answer as it refuses other protocol errors (``UpstreamClosed``
naming the status), so the sidecar answers 502 naming it (retryable: the gateway tries another
worker) and a gateway with no worker left answers 503 naming it. Before, ``HTTP/1.1 999`` went to
the client unchanged (and ``099`` was waited past as an interim answer).

Real HTTP on 127.0.0.1: a raw stand-in engine writing the exact status line, the real sidecar and
gateway (``listening``), an aiohttp client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from fleet_fixtures import relayed

from prefixfleet.router.upstream import Origin, UpstreamClosed, UpstreamPool

pytestmark = pytest.mark.timeout(60)

BAD_STATUSES = ["999", "600", "099"]


@asynccontextmanager
async def engine_answering(status: str) -> AsyncIterator[str]:
    """A stand-in engine: ``GET /health`` is 200, any other request gets ``status`` with a JSON body."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                code = b"200 OK" if head.startswith(b"GET /health ") else status.encode() + b" Odd"
                body = b'{"text": "hi"}'
                writer.write(
                    b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (code, len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("status", BAD_STATUSES)
async def test_the_upstream_client_refuses_a_status_outside_100_to_599(status: str) -> None:
    pool = UpstreamPool()
    async with engine_answering(status) as url:
        host, port = url.removeprefix("http://").split(":")
        exchange = await pool.send(Origin(host, int(port)), "POST", "/generate", [], b"{}")
        with pytest.raises(UpstreamClosed, match=f"invalid status {int(status)} "):
            await exchange.response()
        exchange.close()
    pool.close()


@pytest.mark.parametrize("status", BAD_STATUSES)
@pytest.mark.parametrize(("hops", "answer"), [("sidecar", 502), ("gateway", 503), ("gateway+sidecar", 503)])
async def test_a_bad_engine_status_is_answered_as_an_upstream_failure_naming_it(
    status: str, hops: str, answer: int
) -> None:
    async with (
        engine_answering(status) as engine_url,
        relayed(hops, engine_url, max_retries=1) as url,
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as resp,
    ):
        assert resp.status == answer
        error = (await resp.json())["error"]
    assert f"invalid status {int(status)} (HTTP status codes are 100..599)" in error["message"]


async def test_599_is_still_an_answer() -> None:
    pool = UpstreamPool()
    async with engine_answering("599") as url:
        host, port = url.removeprefix("http://").split(":")
        exchange = await pool.send(Origin(host, int(port)), "POST", "/generate", [], b"{}")
        response = await exchange.response()
        assert response.status == 599
        assert await response.read() == b'{"text": "hi"}'
        exchange.close()
    pool.close()
