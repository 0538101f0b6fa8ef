"""The front's own 500 (a handler bug on a hot path) names the request, as every gateway answer does.

Specification (docs/gateway.md, Request ids: "every answer names it in X-Request-Id"): a generation
request the lean front serves whose handler fails with an exception is answered 500 "internal
error" by the front itself. Before, that answer carried no ``X-Request-Id``: the protocol's own
answers got one through ``refusal_headers`` (tests/test_front_refusal_request_id.py) but the front's
500 did not. Now the front adds ``refusal_headers(request)`` to it too, and the gateway's id for a
front request is asked once and kept on the request, so the 500 names the id the handler had
already used (the client's, else the one generated for it: the id the worker was sent), not a
fresh one. A hook that fails leaves the 500 as it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import pytest
from aiohttp import web
from fleet_fixtures import relayed
from test_gateway_request_id import raw_exchange, recording_engine

from prefixfleet.router import gateway
from prefixfleet.router.front import HotRequest, serving_front
from prefixfleet.router.proxying import AnyRequest, json_error
from prefixfleet.router.slow_clients import ClientTimeouts

pytestmark = pytest.mark.timeout(60)

BODY = json.dumps({"prompt": "hello", "max_tokens": 1}).encode()


def _post(extra_headers: bytes = b"") -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + extra_headers
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY)
        + BODY
    )


@pytest.fixture
def failing_generate(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The gateway's generation handler fails after it named the request; the ids it was given."""
    given: list[str] = []

    async def broken(self: gateway.Gateway, request: AnyRequest, endpoint: str, started: float, rid: str):
        given.append(rid)
        raise RuntimeError("a handler bug")

    monkeypatch.setattr(gateway.Gateway, "_generate", broken)
    return given


@pytest.mark.parametrize(
    ("client_header", "expected"),
    [(b"X-Request-Id: client-7\r\n", "client-7"), (b"", None)],
    ids=["client id", "generated id"],
)
async def test_the_fronts_500_names_the_id_the_handler_used(
    failing_generate: list[str], client_header: bytes, expected: str | None
) -> None:
    async with recording_engine() as engine, relayed("gateway", engine.url) as url:
        status, headers, body = await raw_exchange(int(url.rsplit(":", 1)[1]), _post(client_header))
    assert status == 500, body
    assert b"internal error" in body
    assert failing_generate, "the hot path did not run the handler"
    named = headers.get("x-request-id")
    assert named == failing_generate[0]
    if expected is not None:
        assert named == expected
    else:
        assert re.fullmatch(r"cmpl-[0-9a-f]{24}", named or ""), headers


# -- the front alone -------------------------------------------------------------------------------


async def _broken_hot(_request: HotRequest) -> web.Response:
    raise RuntimeError("a hot handler bug")


def _error(_request: AnyRequest, status: int, message: str) -> web.Response:
    return json_error(status, message, param="body")


def _named(request: AnyRequest) -> Mapping[str, str]:
    return {"X-Named": f"{request.method} {request.path}"}


def _failing(_request: AnyRequest) -> Mapping[str, str]:
    raise RuntimeError("a hook bug")


async def _hot_answer(refusal_headers: object) -> tuple[int, dict[str, str], bytes]:
    async with serving_front(
        web.Application(),
        "127.0.0.1",
        0,
        {"/v1/completions": _broken_hot},
        _error,
        timeouts=ClientTimeouts(),
        max_body_bytes=1024,
        refusal_headers=refusal_headers,  # type: ignore[arg-type]
    ) as serving:
        return await raw_exchange(serving.port, _post())


async def test_the_fronts_hook_names_its_own_500_and_a_failing_hook_leaves_it_as_it_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, headers, _body = await _hot_answer(_named)
    assert (status, headers.get("x-named")) == (500, "POST /v1/completions")
    status, headers, _body = await _hot_answer(None)
    assert status == 500 and "x-named" not in headers
    status, headers, body = await _hot_answer(_failing)
    assert status == 500 and b"internal error" in body
    assert "naming the answer to a refused request failed" in caplog.text
