"""A client sending ``Expect: 100-continue`` with a declared Content-Length above the body limit
gets the final 413 at once, and is not invited to upload (router/proxying.py
``expect_within_limit``, on every route that takes a body of the gateway, the sidecar and the
emulator). RFC 9110 section 10.1.1 lets a server answer a final status in place of the 100; curl
sends the header for large bodies. The services run in this event loop (tests/test_early_answer_drain.py's
``serving``: 1 MiB limit, gateway and sidecar with their lean front, which hands Expect requests to
aiohttp).

Specification:
* headers with ``Expect: 100-continue`` and Content-Length 2 MiB, and no body: the first answer is
  ``HTTP/1.1 413`` with the services' JSON error and ``Connection: close`` (before: ``100
  Continue``, then the 413 once the client had uploaded the body, which was drained and dropped);
  the server then closes the connection (the client half-closes: the drain ends on it, no waiting);
* the same within the limit: ``100 Continue``, then, once the body is sent, the request is served;
* every route that takes a body answers so (each service's POST routes, the sidecar's catch-all
  proxy route too);
* a client that sends its body without waiting for the 100 reads the 413 (the body is drained as
  after the middlewares' early answers), then the connection ends;
* another expectation still gets aiohttp's 417.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import pytest
from test_early_answer_drain import MAX_BODY, SERVICES, read_answer, serving

pytestmark = pytest.mark.timeout(120)

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# the routes that take a body, by service (the sidecar's last: its catch-all route to the engine)
BODY_ROUTES = {
    "emulator": ["/generate", "/v1/completions", "/v1/chat/completions", "/flush_cache"],
    "sidecar": [
        "/generate",
        "/v1/chat/completions",
        "/prefixfleet/state",
        "/prefixfleet/warm",
        "/flush_cache",
    ],
    "gateway": ["/generate", "/v1/completions", "/v1/chat/completions"],
}
VALID = json.dumps({"prompt": "still here", "max_tokens": 1}).encode()


def head(length: int, expect: str = "100-continue", path: str = "/v1/completions") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nExpect: {expect}\r\n\r\n"
    ).encode()


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("service", SERVICES)
async def test_an_oversized_declared_length_gets_413_not_100(
    service: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(service) as url, connected(url) as (reader, writer):
        writer.write(head(2 * MAX_BODY))  # and not a byte of the body: the client waits for the 100
        answer = await reader.readuntil(b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 413 "), answer  # before: b"HTTP/1.1 100 Continue\r\n\r\n"
        headers = {
            name.strip().lower(): value.strip()
            for name, value in (line.split(":", 1) for line in answer.decode("latin-1").split("\r\n")[1:-2])
        }
        body = await reader.readexactly(int(headers["content-length"]))
        writer.write_eof()  # the client goes, as curl does on a final answer: the server's drain ends
        rest = await reader.read()
    error = json.loads(body)["error"]
    assert (error["param"], error["code"]) == ("body", 413)
    assert f"exceeds {MAX_BODY} bytes" in error["message"]
    assert headers["connection"] == "close"
    assert rest == b""  # closed, and nothing (no 100, no second answer) after the 413
    assert server_errors(caplog) == []


@pytest.mark.parametrize("service", SERVICES)
async def test_a_length_within_the_limit_gets_100_then_is_served(
    service: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(service) as url, connected(url) as (reader, writer):
        writer.write(head(len(VALID)))
        assert await reader.readexactly(len(CONTINUE)) == CONTINUE
        writer.write(VALID)
        status, _headers, body = await read_answer(reader)
    assert status == 200, body[:500]
    assert json.loads(body)["choices"]
    assert server_errors(caplog) == []


@pytest.mark.parametrize("service", SERVICES)
async def test_every_route_taking_a_body_answers_413_first(service: str) -> None:
    firsts = {}
    async with serving(service) as url:
        for path in BODY_ROUTES[service]:
            async with connected(url) as (reader, writer):
                writer.write(head(2 * MAX_BODY, path=path))
                firsts[path] = (await reader.readuntil(b"\r\n")).split(b" ", 2)[1]
    assert firsts == dict.fromkeys(BODY_ROUTES[service], b"413")


@pytest.mark.parametrize("service", SERVICES)
async def test_a_client_not_waiting_for_the_100_reads_the_413(service: str) -> None:
    async with serving(service) as url, connected(url) as (reader, writer):
        writer.write(head(2 * MAX_BODY) + bytes(2 * MAX_BODY))  # head and body at once
        status, headers, _body = await read_answer(reader)
        rest = await reader.read()  # the server drains the body, then closes (the body ended)
    assert (status, headers["connection"], rest) == (413, "close", b"")


@pytest.mark.parametrize("service", SERVICES)
async def test_another_expectation_still_gets_417(service: str) -> None:
    async with serving(service) as url, connected(url) as (reader, writer):
        writer.write(head(2 * MAX_BODY, expect="something-else"))
        first_line = await reader.readuntil(b"\r\n")
    assert first_line.startswith(b"HTTP/1.1 417 "), first_line
