"""Every error answered before the request body was read whole reaches a client still uploading,
in the emulator as in the gateway and the sidecar (router/proxying.py ``drain_refused_bodies``); a
body whose declared length is above the limit is refused before it is read
(router/slow_clients.py ``declared_too_large``). The services run in this event loop on 127.0.0.1,
each with a 1 MiB body limit; the gateway and sidecar with their lean front, as deployed.

Specification:
* the emulator answers an oversized upload (Content-Length or chunked) with its 413, and every
  service a body in a Content-Encoding it cannot decode (``compress``: no parser refusal, the
  middleware's 415), to an httpx async client that pauses twice mid-upload, each time longer than
  aiohttp's 2 s of lingering (well within the drain's 5 s idle limit): the client reads the answer, not a
  ``httpx.ReadError``; the service then serves a valid request. The pause makes the old failure
  deterministic (see tests/test_oversized_upload_413.py, whose client this is);
* a request declaring a Content-Length above the limit gets its 413 before it sends any of its
  body, from every service (the hot front hands such a request to aiohttp); before, the server
  waited for the body and answered 408 at the body limit (30 s);
* a gzip body longer than the limit that decodes within it is still served: the limit counts
  decoded bytes, so only a body sent as is is refused by its length;
* the rules on plain data: which statuses are drained (not 408: the client stopped sending), and
  when a declared length alone refuses a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp
from test_oversized_upload_413 import PIECE, paced_pieces

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer
from prefixfleet.router import gateway, sidecar
from prefixfleet.router.proxying import drain_refused_bodies, drained_after, json_error
from prefixfleet.router.slow_clients import ClientTimeouts, body_deadline, declared_too_large

pytestmark = pytest.mark.timeout(120)

MAX_BODY = 1024 * 1024
SERVICES = ["emulator", "sidecar", "gateway"]
# 2.5 MiB: three pieces at once (past the limit), then one after each of two pauses. Two: after
# one, a piece sent with a Content-Length may still go out whole before the server's reset arrives,
# and the client then reads the answer even from the old code (seen); the next write cannot.
PIECES = 5
VALID = {"prompt": "still here", "max_tokens": 1}


@contextlib.asynccontextmanager
async def serving(service: str) -> AsyncIterator[str]:
    """The base URL of ``service`` (with the emulator behind it) for the block."""
    config = EmulatorConfig(time_scale=1000.0, max_body_bytes=MAX_BODY)
    async with EmulatorServer(config) as engine, contextlib.AsyncExitStack() as stack:
        url = engine.url
        if service in ("sidecar", "gateway"):
            sidecar_config = sidecar.SidecarConfig(
                engine_url=url, redis_url=None, port=0, worker_id="w0", model="m", revision="r",
                max_body_bytes=MAX_BODY,
            )  # fmt: skip
            served = await stack.enter_async_context(sidecar.listening(sidecar_config))
            url = f"http://{LOOPBACK}:{served.port}"
        if service == "gateway":
            gateway_config = gateway.GatewayConfig(port=0, workers=(url,), max_body_bytes=MAX_BODY)
            served_gateway = await stack.enter_async_context(gateway.listening(gateway_config))
            url = f"http://{LOOPBACK}:{served_gateway.port}"
        yield url


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def paced_upload_then_valid(url: str, headers: dict[str, str]) -> tuple[httpx.Response, int]:
    """The paced upload's answer (a TransportError fails the test), and a valid request's status."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        try:
            resp = await client.post(url, content=paced_pieces(PIECES), headers=headers)
        except httpx.TransportError as exc:
            pytest.fail(f"the connection ended before the answer was read: {exc!r}")
        valid = await client.post(url, json=VALID)
        return resp, valid.status_code


@pytest.mark.parametrize(
    ("service", "framing", "coding", "status"),
    [
        ("emulator", "content-length", None, 413),
        ("emulator", "chunked", None, 413),
        ("emulator", "content-length", "compress", 415),
        ("sidecar", "content-length", "compress", 415),
        ("gateway", "chunked", "compress", 415),
    ],
)
async def test_a_slow_upload_answered_early_reads_its_answer(
    service: str, framing: str, coding: str | None, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"Content-Type": "application/json"}
    if framing == "content-length":
        headers["Content-Length"] = str(PIECES * PIECE)  # else httpx sends a generator chunked
    if coding is not None:
        headers["Content-Encoding"] = coding
    async with serving(service) as url:
        resp, valid_status = await paced_upload_then_valid(url + "/v1/completions", headers)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("body", status)
    if status == 413:
        assert f"exceeds {MAX_BODY} bytes" in error["message"] or f"limit of {MAX_BODY}" in error["message"]
    else:
        assert f"Content-Encoding {coding!r} is not supported" in error["message"]
        assert resp.headers["Accept-Encoding"] == "gzip, deflate"
    assert resp.headers["Connection"] == "close"
    assert valid_status == 200
    assert server_errors(caplog) == []


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer with a Content-Length: status, headers (lower-case names) and body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head.rstrip("\r\n").split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("service", SERVICES)
async def test_a_declared_length_above_the_limit_is_refused_before_its_body(
    service: str, caplog: pytest.LogCaptureFixture
) -> None:
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {2 * MAX_BODY}\r\n\r\n"
    ).encode()
    async with serving(service) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(head)  # and not a byte of the body: only the length can refuse it
            # no time limit here: before, the answer was the 408 at the body limit, a wrong status
            status, headers, body = await read_answer(reader)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    assert status == 413, body[:500]
    error = json.loads(body)["error"]
    assert (error["param"], error["code"]) == ("body", 413)
    assert headers["connection"] == "close"
    assert server_errors(caplog) == []


async def test_a_gzip_body_longer_than_the_limit_decoding_within_it_is_served() -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    def body_error(_request: web.Request, status: int, message: str) -> web.Response:
        return json_error(status, message, param="body")

    app = web.Application(
        client_max_size=MAX_BODY,
        middlewares=[drain_refused_bodies(), body_deadline(ClientTimeouts(), body_error)],
    )
    app.router.add_post("/echo", echo)
    plain = os.urandom(MAX_BODY)  # exactly the limit once decoded
    packed = gzip.compress(plain, compresslevel=0)  # stored blocks: a little longer than the limit
    assert len(packed) > MAX_BODY
    async with serve_aiohttp(app) as url, httpx.AsyncClient(timeout=30.0) as client:
        resp = await client.post(url + "/echo", content=packed, headers={"Content-Encoding": "gzip"})
        too_large = await client.post(url + "/echo", content=plain + b"x")
    assert resp.status_code == 200 and resp.content == plain
    assert too_large.status_code == 413  # the same length sent as is


@pytest.mark.parametrize(
    ("status", "drained"), [(413, True), (415, True), (400, True), (500, True), (408, False), (200, False)]
)
def test_every_early_error_but_408_is_drained(status: int, drained: bool) -> None:
    assert drained_after(status) is drained


@pytest.mark.parametrize(
    ("declared", "limit", "codings", "refused"),
    [
        (1001, 1000, [], True),
        (1001, 1000, ["identity"], True),
        (1000, 1000, [], False),  # at the limit is within it
        (None, 1000, [], False),  # chunked: only reading can tell
        (1001, 0, [], False),  # no limit
        (1001, 1000, ["gzip"], False),  # the limit counts decoded bytes
        (1001, 1000, ["compress"], False),  # content_coding answers 415 first
    ],
)
def test_a_declared_length_alone_refuses_only_a_body_sent_as_is(
    declared: int | None, limit: int, codings: list[str], refused: bool
) -> None:
    assert declared_too_large(declared, limit, codings) is refused
