"""Request ids through the data plane, as SGLang's router (sgl-model-gateway) gives them.

Specification (sgl-model-gateway ``middleware.rs`` ``RequestIdMiddleware`` and ``server.rs``): a
request's id is the value of the first header present among ``--request-id-headers`` (default
``x-request-id``, ``x-correlation-id``, ``x-trace-id``, ``request-id``), else a generated one
(``chatcmpl-``/``cmpl-``/``gnt-``/``req-`` and 24 characters; here hex digits); every answer
carries it in ``X-Request-Id``. Here the gateway also sends it upstream in ``X-Request-Id`` (the
sidecar passes it on unchanged, so the engine sees it), names it in its log lines about the
request, and replaces a client value that is too long or not visible ASCII by a generated id
instead of echoing it. The
upstream request also carries ``X-Forwarded-For`` (the client's list, then the client's address)
and ``X-Forwarded-Proto``.

Real HTTP on 127.0.0.1: the real gateway and sidecar (``relayed``, in this event loop) in front of
a stand-in engine (aiohttp) that records the headers it received (the emulator cannot show them);
raw sockets where a client library would refuse to send the header.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, prefixfleet_argv, relayed, serve_aiohttp
from multidict import CIMultiDict

from prefixfleet.router.request_ids import MAX_REQUEST_ID_CHARS, upstream_header_pairs

pytestmark = pytest.mark.timeout(60)

GENERATED = {
    "/v1/chat/completions": re.compile(r"chatcmpl-[0-9a-f]{24}"),
    "/v1/completions": re.compile(r"cmpl-[0-9a-f]{24}"),
    "/generate": re.compile(r"gnt-[0-9a-f]{24}"),
}
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
}


@dataclass
class Engine:
    url: str
    seen: list[CIMultiDict[str]] = field(default_factory=list)
    hang: asyncio.Event = field(default_factory=asyncio.Event)  # set: answers wait for release
    release: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def recording_engine() -> AsyncIterator[Engine]:
    """A stand-in engine: records each generation request's headers, answers whole or streamed."""
    engine = Engine(url="")

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        engine.seen.append(CIMultiDict(request.headers))
        if engine.hang.is_set():
            await engine.release.wait()
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "ok"}], "text": "ok", "usage": {}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "text": "ok"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    for path in BODIES:
        app.router.add_post(path, generate)
    app.router.add_get("/health", health)
    async with serve_aiohttp(app) as url:
        engine.url = url
        yield engine


async def post(
    session: aiohttp.ClientSession, url: str, path: str, headers: dict[str, str], *, stream: bool = False
) -> tuple[int, CIMultiDict[str], bytes]:
    async with session.post(url + path, json={**BODIES[path], "stream": stream}, headers=headers) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


async def raw_exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as bytes, read the answer until the connection closes (the request asks it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
async def test_a_client_id_is_echoed_and_reaches_the_engine(path: str, stream: bool) -> None:
    async with (
        recording_engine() as engine,
        relayed("gateway+sidecar", engine.url) as url,
        aiohttp.ClientSession() as session,
    ):
        status, headers, body = await post(
            session,
            url,
            path,
            {"X-Request-Id": "client-id.42", "X-Forwarded-For": "203.0.113.7"},
            stream=stream,
        )
    assert status == 200, body
    assert headers.getall("X-Request-Id") == ["client-id.42"]
    [seen] = engine.seen
    assert seen.getall("X-Request-Id") == ["client-id.42"]  # the sidecar passed it on unchanged
    # the client's address appended to the list a proxy in front of the gateway started
    assert seen.getall("X-Forwarded-For") == ["203.0.113.7, 127.0.0.1"]
    assert seen.getall("X-Forwarded-Proto") == ["http"]


async def test_the_first_header_present_names_the_request_in_sglangs_order() -> None:
    async with (
        recording_engine() as engine,
        relayed("gateway+sidecar", engine.url) as url,
        aiohttp.ClientSession() as session,
    ):
        path = "/generate"
        _, only_correlation, _ = await post(session, url, path, {"X-Correlation-Id": "corr-1"})
        _, both, _ = await post(session, url, path, {"X-Correlation-Id": "corr-2", "X-Request-Id": "req-2"})
        _, trace, _ = await post(session, url, path, {"Request-Id": "plain-3", "X-Trace-Id": "trace-3"})
    assert [only_correlation["X-Request-Id"], both["X-Request-Id"], trace["X-Request-Id"]] == [
        "corr-1",
        "req-2",
        "trace-3",
    ]
    assert [seen["X-Request-Id"] for seen in engine.seen] == ["corr-1", "req-2", "trace-3"]
    # the other id headers are end-to-end headers like any other: passed on as sent
    assert engine.seen[0]["X-Correlation-Id"] == "corr-1" and "X-Forwarded-Proto" in engine.seen[0]
    assert engine.seen[0].getall("X-Forwarded-For") == ["127.0.0.1"]  # none came: the client's address


async def test_request_id_headers_configured_replace_the_defaults() -> None:
    async with (
        recording_engine() as engine,
        relayed("gateway+sidecar", engine.url, request_id_headers=("x-amzn-trace-id",)) as url,
        aiohttp.ClientSession() as session,
    ):
        _, named, _ = await post(
            session, url, "/generate", {"X-Amzn-Trace-Id": "Root=1-abc", "X-Request-Id": "r"}
        )
        _, unnamed, _ = await post(session, url, "/generate", {"X-Request-Id": "not-read"})
    assert named["X-Request-Id"] == "Root=1-abc"
    assert GENERATED["/generate"].fullmatch(unnamed["X-Request-Id"]), unnamed
    # upstream the gateway's id replaces the client's own X-Request-Id (one value, never two)
    assert [seen.getall("X-Request-Id") for seen in engine.seen] == [
        ["Root=1-abc"],
        [unnamed["X-Request-Id"]],
    ]


async def test_a_missing_id_is_generated_unique_per_request() -> None:
    async with (
        recording_engine() as engine,
        relayed("gateway+sidecar", engine.url) as url,
        aiohttp.ClientSession() as session,
    ):
        answered = []
        for i in range(30):
            path = list(BODIES)[i % len(BODIES)]
            status, headers, _ = await post(session, url, path, {}, stream=i % 2 == 1)
            assert status == 200
            answered.append((path, headers["X-Request-Id"]))
    for path, rid in answered:
        assert GENERATED[path].fullmatch(rid), (path, rid)
    ids = [rid for _, rid in answered]
    assert len(set(ids)) == len(ids)
    assert [seen["X-Request-Id"] for seen in engine.seen] == ids


BAD_IDS = [
    pytest.param("x" * (MAX_REQUEST_ID_CHARS + 1), id="too-long"),
    pytest.param("two words", id="space"),
    pytest.param("tab\there", id="tab"),
    pytest.param("caf\xe9", id="not-ascii"),
]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_bad_id_is_replaced_by_a_generated_one(bad: str) -> None:
    async with recording_engine() as engine, relayed("gateway+sidecar", engine.url) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(BODIES["/generate"]).encode()
        status, headers, _ = await raw_exchange(
            port,
            b"POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: " + bad.encode("latin-1") + b"\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
        )
    assert status == 200
    rid = headers["x-request-id"]
    assert GENERATED["/generate"].fullmatch(rid), rid
    [seen] = engine.seen
    assert seen.getall("X-Request-Id") == [rid]


async def test_a_good_id_at_the_length_limit_is_kept() -> None:
    rid = "a" * MAX_REQUEST_ID_CHARS
    async with (
        recording_engine() as engine,
        relayed("gateway+sidecar", engine.url) as url,
        aiohttp.ClientSession() as session,
    ):
        _, headers, _ = await post(session, url, "/generate", {"X-Request-Id": rid})
    assert headers["X-Request-Id"] == rid == engine.seen[0]["X-Request-Id"]


async def test_the_gateways_own_error_answers_carry_the_id(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prefixfleet.gateway")
    async with (
        recording_engine() as engine,
        relayed("gateway+sidecar", engine.url, max_body_bytes=4096, upstream_timeout_s=0.3) as url,
        aiohttp.ClientSession() as session,
    ):
        answers = {}
        for name, path, data in [
            ("bad json", "/generate", b"{not json"),
            ("too large", "/generate", b"x" * 8192),
            ("unknown path", "/nowhere", b"{}"),
        ]:
            async with session.post(
                url + path, data=data, headers={"X-Request-Id": name.replace(" ", "-")}
            ) as r:
                answers[name] = (r.status, r.headers.get("X-Request-Id"))
        async with session.get(url + "/health", headers={"X-Trace-Id": "health-1"}) as r:
            answers["health"] = (r.status, r.headers.get("X-Request-Id"))
        engine.hang.set()  # the engine takes requests and never answers: the gateway's 504
        _, timed_out, body = await post(session, url, "/generate", {"X-Request-Id": "slow-1"})
        answers["timeout"] = (json.loads(body)["error"]["code"], timed_out["X-Request-Id"])
        engine.release.set()
    assert answers == {
        "bad json": (400, "bad-json"),
        "too large": (413, "too-large"),
        "unknown path": (404, "unknown-path"),
        "health": (200, "health-1"),
        "timeout": (504, "slow-1"),
    }
    assert "request slow-1: worker" in caplog.text and "answered 504" in caplog.text


async def test_a_retried_and_failed_request_is_named_in_the_log_and_its_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prefixfleet.gateway")
    async with recording_engine() as engine:
        gone = engine.url
    # the sidecar's engine refuses connections: the sidecar's retryable 502, then no worker is left
    async with relayed("gateway+sidecar", gone) as url, aiohttp.ClientSession() as session:
        status, headers, _ = await post(session, url, "/v1/completions", {"X-Request-Id": "lost-7"})
    assert (status, headers["X-Request-Id"]) == (503, "lost-7")
    retried = [r for r in caplog.records if "retrying elsewhere" in r.getMessage()]
    assert retried and retried[0].getMessage().startswith("request lost-7: worker "), caplog.text


async def test_a_stalled_body_is_answered_408_naming_the_clients_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXFLEET_CLIENT_BODY_TIMEOUT_S", "0.3")
    async with recording_engine() as engine, relayed("gateway", engine.url) as url:
        port = int(url.rsplit(":", 1)[1])
        # a Content-Length body (the lean front's request) that stops half-way
        status, headers, _ = await raw_exchange(
            port,
            b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Correlation-Id: stalled-1\r\n"
            b'Content-Length: 100\r\n\r\n{"text":',
        )
    assert (status, headers.get("x-request-id")) == (408, "stalled-1")


async def metric_lines(session: aiohttp.ClientSession, url: str, name: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name)
    }


async def test_refused_bodies_are_in_the_request_counter_and_duration_histogram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 408 (the lean front's stalled Content-Length body, aiohttp's stalled chunked body) and a 413
    are answered before any handler runs; they counted in requests_total but never in the duration
    histogram, so its count fell short of the requests answered."""
    monkeypatch.setenv("PREFIXFLEET_CLIENT_BODY_TIMEOUT_S", "0.3")
    async with (
        recording_engine() as engine,
        relayed("gateway", engine.url, max_body_bytes=4096) as url,
        aiohttp.ClientSession() as session,
    ):
        port = int(url.rsplit(":", 1)[1])
        front, _, _ = await raw_exchange(
            port, b'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"text":'
        )
        chunked, _, _ = await raw_exchange(
            port, b'POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"te\r\n'
        )
        async with session.post(url + "/generate", data=b"x" * 8192) as resp:
            too_large = resp.status
        assert (front, chunked, too_large) == (408, 408, 413)
        counts = await eventually(
            lambda: metric_lines(session, url, "prefixfleet_gateway_request"),
            10,
            "the refusals counted",
            done=lambda m: m.get('prefixfleet_gateway_requests_total{code="408",endpoint="/generate"}') == 2,
        )
    assert counts['prefixfleet_gateway_requests_total{code="413",endpoint="/generate"}'] == 1
    assert counts['prefixfleet_gateway_request_duration_seconds_count{endpoint="/generate"}'] == 3
    # the two 408s each waited out the 0.3 s body limit, at least
    assert counts['prefixfleet_gateway_request_duration_seconds_sum{endpoint="/generate"}'] >= 0.59


def test_upstream_headers_join_the_forwarded_chain_and_keep_a_proxys_scheme() -> None:
    forwarded = [
        ("x-request-id", "client"),
        ("X-Forwarded-For", "198.51.100.1"),
        ("Authorization", "Bearer k"),
        ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
        ("X-Forwarded-Proto", "https"),
    ]
    assert upstream_header_pairs(forwarded, "rid-1", "127.0.0.1", "http") == [
        ("Authorization", "Bearer k"),
        ("X-Forwarded-Proto", "https"),  # an ingress in front terminated TLS: kept
        ("X-Forwarded-For", "198.51.100.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"),
        ("X-Request-Id", "rid-1"),
    ]
    assert upstream_header_pairs([], "rid-2", None, "http") == [
        ("X-Forwarded-Proto", "http"),
        ("X-Request-Id", "rid-2"),
    ]


def test_a_bad_request_id_headers_flag_is_refused_in_one_line() -> None:
    run = subprocess.run(
        prefixfleet_argv(
            "router",
            "gateway",
            "--port",
            "1",
            "--worker",
            "http://127.0.0.1:9",
            "--request-id-headers",
            "a b",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .endswith("--request-id-headers must be an HTTP header name (letters, digits, '-'), got 'a b'")
    ), run.stderr
