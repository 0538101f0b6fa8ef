"""Answers aiohttp's protocol gives before any app code runs carry the gateway's request id.

Specification: every gateway answer names its request in ``X-Request-Id`` (docs/gateway.md, Request
ids; tests/test_gateway_request_id.py). A request the HTTP parser refuses (a malformed head: 400; a
body in a coding it cannot decode, br or zstd: 415) is answered by the protocol, not the app, so the
gateway's request-id middleware never sees it: before, those answers carried no ``X-Request-Id``.
Now the front takes ``refusal_headers(request)`` (router/front.py) and the gateway gives such an
answer a generated id (``req-`` and 24 hex digits: the head could not be read, so neither could a
client's id), unique per request. A server that passes none (the sidecar, the emulator) answers as
before, and a hook that fails leaves the answer as it was rather than failing it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from aiohttp import web
from fleet_fixtures import relayed
from test_gateway_request_id import raw_exchange, recording_engine

from prefixfleet.router.front import serving_front
from prefixfleet.router.proxying import AnyRequest, json_error
from prefixfleet.router.slow_clients import ClientTimeouts

pytestmark = pytest.mark.timeout(60)

GENERATED = re.compile(r"req-[0-9a-f]{24}")
REFUSED = {
    "a header name with a space": (
        b"POST /generate HTTP/1.1\r\nHost: t\r\nBad Name: x\r\nContent-Length: 2\r\n\r\n{}"
    ),
    "a non-ASCII URL": b"GET /v1/models\xff HTTP/1.1\r\nHost: t\r\n\r\n",
    "two Content-Lengths": (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nX-Request-Id: mine\r\n"
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "a bare LF line end": b"POST /generate HTTP/1.1\nHost: t\r\n\r\n",
    "an unknown method": b"BREW /generate HTTP/1.1\r\nHost: t\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", list(REFUSED.values()), ids=list(REFUSED))
async def test_a_request_the_parser_refuses_gets_a_generated_request_id(request_bytes: bytes) -> None:
    async with recording_engine() as engine, relayed("gateway", engine.url) as url:
        port = int(url.rsplit(":", 1)[1])
        first = await raw_exchange(port, request_bytes)
        second = await raw_exchange(port, request_bytes)
    for status, headers, body in (first, second):
        assert status == 400, body
        assert b'"malformed HTTP request' in body
        assert GENERATED.fullmatch(headers.get("x-request-id", "")), headers
    assert first[1]["x-request-id"] != second[1]["x-request-id"]
    assert engine.seen == []


async def test_a_body_in_a_coding_the_parser_cannot_decode_gets_a_request_id_with_its_415() -> None:
    request = (
        b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Encoding: br\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n{}"
    )
    async with recording_engine() as engine, relayed("gateway", engine.url) as url:
        status, headers, body = await raw_exchange(int(url.rsplit(":", 1)[1]), request)
    assert status == 415, body
    assert GENERATED.fullmatch(headers.get("x-request-id", "")), headers


# -- the front's hook, without a gateway -----------------------------------------------------------


async def _boom(_request: web.Request) -> web.Response:
    raise RuntimeError("a handler bug no middleware answers")


def _error(_request: AnyRequest, status: int, message: str) -> web.Response:
    return json_error(status, message, param="body")


async def _answers(refusal_headers: object, request: bytes) -> tuple[int, dict[str, str], bytes]:
    app = web.Application()
    app.router.add_get("/boom", _boom)
    async with serving_front(
        app,
        "127.0.0.1",
        0,
        {},
        _error,
        timeouts=ClientTimeouts(),
        max_body_bytes=1024,
        refusal_headers=refusal_headers,  # type: ignore[arg-type]
    ) as serving:
        return await raw_exchange(serving.port, request)


MALFORMED = REFUSED["a header name with a space"]
UNANSWERED = b"GET /boom HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def _named(request: web.BaseRequest) -> Mapping[str, str]:
    return {"X-Named": f"{request.method} {request.path}"}


def _failing(_request: web.BaseRequest) -> Mapping[str, str]:
    raise RuntimeError("a hook bug")


@pytest.mark.parametrize(("request_bytes", "status"), [(MALFORMED, 400), (UNANSWERED, 500)])
async def test_the_fronts_hook_names_the_protocols_own_answers_and_none_leaves_them_as_before(
    request_bytes: bytes, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    answered, headers, _body = await _answers(_named, request_bytes)
    assert answered == status
    assert "x-named" in headers
    answered, headers, _body = await _answers(None, request_bytes)
    assert answered == status
    assert "x-named" not in headers
    answered, headers, _body = await _answers(_failing, request_bytes)  # the answer still goes out
    assert answered == status
    assert "naming the answer to a refused request failed" in caplog.text
