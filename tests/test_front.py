"""The proxies' lean HTTP/1.1 front (router/front.py), on a real socket on 127.0.0.1.

Hot paths (here ``POST /generate``) are answered by the front's handler; anything else, and anything
unusual, is answered by the aiohttp app behind it on the same connection. Slow clients are bounded
the same way as under aiohttp alone (408 for a stalled body, idle connections closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixfleet.router.front import HotRequest, head_end, serve_front
from prefixfleet.router.proxying import AnyRequest, json_error, open_stream
from prefixfleet.router.slow_clients import ClientTimeouts, body_deadline

MAX_BODY = 1024


async def hot_generate(request: AnyRequest) -> web.StreamResponse | object:
    body = await request.read()
    served_by = "front" if isinstance(request, HotRequest) else "aiohttp"
    if body == b"boom":
        raise RuntimeError("handler bug")
    if body == b"stream":
        response = await open_stream(
            request, 200, {"Content-Type": "text/event-stream", "X-Served-By": served_by}
        )
        for i in range(3):
            await response.write(b"data: %d\n\n" % i)
        await response.write_eof()
        return response
    return web.Response(body=b"echo:" + body, headers={"X-Served-By": served_by})


async def health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _body_error(_request: AnyRequest, status: int, message: str) -> web.Response:
    return json_error(status, message, param="body")


@contextlib.asynccontextmanager
async def front_server(timeouts: ClientTimeouts) -> AsyncIterator[int]:
    app = web.Application(client_max_size=MAX_BODY, middlewares=[body_deadline(timeouts, _body_error)])
    app.router.add_post("/generate", hot_generate)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **timeouts.runner_kwargs())
    await runner.setup()
    server, front = await serve_front(
        runner,
        "127.0.0.1",
        0,
        {"/generate": hot_generate},
        _body_error,
        timeouts=timeouts,
        max_body_bytes=MAX_BODY,
    )
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await front.shutdown(timeout_s=1.0)
        await runner.cleanup()


def _post(body: bytes, path: str = "/generate", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path.encode(),
        extra,
        len(body),
        body,
    )


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split(" ")[1]), headers, body


async def test_hot_requests_keep_alive_and_pipelined_answers_stay_in_order() -> None:
    async with front_server(ClientTimeouts()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"one"))
        status, headers, body = await _response(reader)
        assert (status, body, headers["x-served-by"], headers["content-length"]) == (
            200,
            b"echo:one",
            "front",
            "8",
        )
        assert "date" in headers
        writer.write(_post(b"two") + _post(b"three") + _post(b"stream"))  # pipelined in one segment
        status, headers, body = await _response(reader)
        assert (status, body, headers["x-served-by"]) == (200, b"echo:two", "front")
        assert (await _response(reader))[2] == b"echo:three"
        status, headers, body = await _response(reader)
        assert (status, headers["content-type"], body) == (
            200,
            "text/event-stream",
            b"data: 0\n\ndata: 1\n\ndata: 2\n\n",
        )
        writer.close()


async def test_other_requests_go_to_aiohttp_on_the_same_connection() -> None:
    async with front_server(ClientTimeouts()) as port, aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}"
        async with session.post(f"{url}/generate", data=b"first") as resp:
            assert (resp.headers["X-Served-By"], await resp.read()) == ("front", b"echo:first")
        async with session.get(f"{url}/health") as resp:
            assert (resp.status, await resp.json()) == (200, {"status": "ok"})
        async with session.get(f"{url}/nowhere") as resp:
            assert resp.status == 404
        async with session.post(f"{url}/generate", data=b"stream") as resp:
            assert (resp.status, await resp.read()) == (200, b"data: 0\n\ndata: 1\n\ndata: 2\n\n")
        async with session.post(f"{url}/generate", data=b"x" * (MAX_BODY + 1)) as resp:
            assert resp.status == 413  # aiohttp's limit and the app's own answer


async def test_malformed_and_unusual_requests_get_aiohttp_answers() -> None:
    async with front_server(ClientTimeouts()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n")
        status, _headers, _body = await _response(reader)
        assert status == 400
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        chunked = (
            b"POST /generate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        writer.write(chunked)
        status, headers, body = await _response(reader)
        assert (status, body, headers["x-served-by"]) == (200, b"echo:abc", "aiohttp")
        writer.close()


async def test_handler_error_is_a_500_and_closes_the_connection() -> None:
    async with front_server(ClientTimeouts()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"boom"))
        status, headers, body = await _response(reader)
        assert (status, headers.get("connection")) == (500, "close")
        assert json.loads(body) == {  # the OpenAI error shape the proxies answer everything else in
            "error": {"message": "internal error", "type": "server_error", "param": None, "code": 500}
        }
        assert await reader.read() == b""
        writer.close()


async def test_stalled_body_gets_408_and_idle_connection_is_closed() -> None:
    async with front_server(ClientTimeouts(body_s=0.3, idle_s=0.5)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        status, _headers, body = await asyncio.wait_for(_response(reader), 5)
        assert status == 408 and b"not received within" in body
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"then idle"))
        assert (await _response(reader))[2] == b"echo:then idle"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after the idle limit
        writer.close()


@pytest.mark.parametrize(
    "head",
    [
        # both framings: a reader trusting one of them would smuggle the rest as a second request
        b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: t\r\nX-Folded: a\r\n b\r\nContent-Length: 3\r\n\r\n",  # obs-fold
        b"POST /generate HTTP/1.1\r\nHost: t\r\nX\x01Bad: 1\r\nContent-Length: 3\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: t\r\nX-Nul: a\x00b\r\nContent-Length: 3\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: t\nContent-Length: 3\r\n\r\n",  # a bare LF line end
        b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\n",
    ],
    ids=[
        "length-and-chunked",
        "two-lengths",
        "obs-fold",
        "bad-name-byte",
        "nul-in-value",
        "bare-lf",
        "signed",
    ],
)
async def test_ambiguous_or_invalid_heads_are_refused_not_misread(head: bytes) -> None:
    async with front_server(ClientTimeouts()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"abc" + _post(b"smuggled"))
        status, headers, body = await asyncio.wait_for(_response(reader), 5)
        assert status == 400 and "x-served-by" not in headers
        rest = await asyncio.wait_for(reader.read(), 5)  # the connection ends; nothing else answered
        assert b"echo:" not in body + rest
        writer.close()


async def test_a_pipelined_other_request_is_handed_over_from_its_first_byte() -> None:
    async with front_server(ClientTimeouts()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        health = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
        writer.write(_post(b"hot") + health + _post(b"after"))  # one segment, three requests
        status, headers, body = await _response(reader)
        assert (status, body, headers["x-served-by"]) == (200, b"echo:hot", "front")
        status, _headers, body = await _response(reader)
        assert (status, body) == (200, b'{"status": "ok"}')
        status, headers, body = await _response(reader)  # the connection now stays with aiohttp
        assert (status, body, headers["x-served-by"]) == (200, b"echo:after", "aiohttp")
        writer.close()


@pytest.mark.parametrize(
    "extra",
    [b"X-Name: caf\xc3\xa9\r\n", b"Expect: 100-continue\r\n", b"Connection: upgrade\r\n"],
    ids=["non-ascii-value", "expect", "connection-upgrade"],
)
async def test_valid_but_unusual_requests_are_served_by_aiohttp(extra: bytes) -> None:
    async with front_server(ClientTimeouts()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"odd", extra=extra))
        if extra.startswith(b"Expect"):
            assert (await _response(reader))[0] == 100  # aiohttp's interim answer, then the real one
        status, headers, body = await asyncio.wait_for(_response(reader), 5)
        assert (status, body, headers["x-served-by"]) == (200, b"echo:odd", "aiohttp")
        writer.close()


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b"a"]), max_size=80).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=120)),
    limit=st.integers(min_value=0, max_value=100),
)
def test_the_head_end_found_chunk_by_chunk_is_the_one_a_search_of_the_whole_finds(
    data: bytes, cuts: list[int], limit: int
) -> None:
    """head_end searches only a grown buffer's new bytes (and the 3 before them) yet answers, after
    every chunk, what a search from the start would: the first CRLF CRLF within the head limit."""
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        buffer = data[:cut]
        end, start = head_end(buffer, start, limit)
        assert end == buffer.find(b"\r\n\r\n", 0, limit + 4)
        if end >= 0:
            return


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_pipelined_requests_in_any_chunking_get_the_same_answers(cuts: list[int]) -> None:
    """Where the writes split the requests (inside a head's blank line, a body, between requests) does
    not change what the front answers."""
    wire = _post(b"one") + _post(b"stream") + _post(b"three", extra=b"X-Pad: " + b"p" * 40 + b"\r\n")
    pieces = [wire[a:b] for a, b in itertools.pairwise([0, *sorted(cuts), len(wire)])]

    async def exchange() -> list[tuple[int, bytes, str]]:
        async with front_server(ClientTimeouts()) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0)
            answers = []
            for _ in range(3):
                status, headers, body = await asyncio.wait_for(_response(reader), 5)
                answers.append((status, body, headers["x-served-by"]))
            writer.close()
            return answers

    assert asyncio.run(exchange()) == [
        (200, b"echo:one", "front"),
        (200, b"data: 0\n\ndata: 1\n\ndata: 2\n\n", "front"),
        (200, b"echo:three", "front"),
    ]
