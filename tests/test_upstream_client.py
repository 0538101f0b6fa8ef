"""The proxies' lean HTTP/1.1 client (router/upstream.py) against real sockets on 127.0.0.1.

Each scripted server answers with exact bytes, so the framing cases (Content-Length, chunked split at
awkward places, read-until-close, interim 100, HEAD, 204) and the failure cases (refused, cut
mid-body, an idle keep-alive connection the server closed) are each pinned down.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from prefixfleet.router.upstream import Origin, UpstreamClosed, UpstreamPool, split_url

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], "asyncio.Future[None] | object"]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return head.decode("latin-1"), body


@contextlib.asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[tuple[Origin, list[str]]]:
    """A server on 127.0.0.1 running ``script(reader, writer, connection_number)`` per connection;
    yields its origin and the request heads it received, in order."""
    heads: list[str] = []
    connections = 0

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await script(reader, writer, connections)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def recording(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        original = reader.readuntil

        async def readuntil(separator: bytes = b"\n") -> bytes:
            data = await original(separator)
            if separator == b"\r\n\r\n":
                heads.append(data.decode("latin-1"))
            return data

        reader.readuntil = readuntil  # type: ignore[method-assign]
        await on_connection(reader, writer)

    server = await asyncio.start_server(recording, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Origin("127.0.0.1", port), heads
    finally:
        server.close()
        await server.wait_closed()


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + (b"Content-Length: %d\r\n\r\n" % len(body) + body)
    )


async def test_content_length_answers_reuse_one_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: int) -> None:
        while True:
            _head, body = await _read_request(reader)
            writer.write(_ok(b'{"echo":' + body + b',"conn":%d}' % conn))
            await writer.drain()

    pool = UpstreamPool()
    async with scripted_server(script) as (origin, heads):
        for i in range(3):
            async with await pool.send(origin, "POST", "/generate?x=1", [("X-Test", "v")], b"%d" % i) as ex:
                response = await ex.response()
                assert response.status == 200
                assert response.headers["Content-Type"] == "application/json"
                assert await response.read() == b'{"echo":%d,"conn":1}' % i
    pool.close()
    assert heads[0].startswith("POST /generate?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{origin.port}\r\n" in heads[0]
    assert "X-Test: v\r\n" in heads[0]
    assert "Content-Length: 1\r\n" in heads[0]


async def test_chunked_body_split_anywhere_streams_in_order() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(5)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nX-Trailer: t\r\n\r\n"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _conn: int) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for i in range(0, len(framed), 7):  # cut through size lines, data and CRLFs alike
            writer.write(framed[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0.001)
        await _read_request(reader)  # the connection stays usable after the terminal chunk
        writer.write(_ok(b"second"))
        await writer.drain()

    pool = UpstreamPool()
    async with scripted_server(script) as (origin, _heads):
        async with await pool.send(origin, "POST", "/generate", [], b"{}") as ex:
            response = await ex.response()
            received = [chunk async for chunk in response.iter_chunks()]
        assert b"".join(received) == b"".join(events)
        async with await pool.send(origin, "GET", "/again", [], None) as ex:
            assert await (await ex.response()).read() == b"second"
    pool.close()


async def test_body_until_close_interim_100_head_and_204() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: int) -> None:
        head, _ = await _read_request(reader)
        if head.startswith("HEAD"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n")  # no body follows a HEAD answer
            await _read_request(reader)
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await _read_request(reader)
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"after-continue"))
            await writer.drain()
            await reader.read()  # until the client hangs up
        else:
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
            await writer.drain()

    pool = UpstreamPool()
    async with scripted_server(script) as (origin, _heads):
        async with await pool.send(origin, "POST", "/old", [], b"x") as ex:
            assert await (await ex.response()).read() == b"until the end"
        async with await pool.send(origin, "HEAD", "/h", [], None) as ex:
            response = await ex.response()
            assert (response.status, await response.read()) == (200, b"")
        async with await pool.send(origin, "DELETE", "/d", [], None) as ex:
            response = await ex.response()
            assert (response.status, await response.read()) == (204, b"")
        async with await pool.send(origin, "POST", "/c", [], b"y") as ex:
            response = await ex.response()
            assert (response.status, await response.read()) == (200, b"after-continue")
    pool.close()


async def test_idle_connection_closed_by_the_server_is_replaced_transparently() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: int) -> None:
        await _read_request(reader)
        writer.write(_ok(b"conn %d" % conn))  # keep-alive promised, then closed right away
        await writer.drain()

    pool = UpstreamPool()
    async with scripted_server(script) as (origin, _heads):
        answers = []
        for _ in range(3):
            async with await pool.send(origin, "POST", "/generate", [], b"{}") as ex:
                answers.append(await (await ex.response()).read())
            await asyncio.sleep(0.05)
    pool.close()
    assert answers == [b"conn 1", b"conn 2", b"conn 3"]


async def test_refused_cut_short_and_garbage_raise_connection_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    pool = UpstreamPool(connect_timeout_s=2.0)
    with pytest.raises(ConnectionRefusedError):
        await pool.send(Origin("127.0.0.1", closed_port), "POST", "/generate", [], b"{}")

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _conn: int) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async with scripted_server(cut) as (origin, _heads):
        ex = await pool.send(origin, "POST", "/generate", [], b"{}")
        response = await ex.response()
        with pytest.raises(UpstreamClosed):
            await response.read()
        ex.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _conn: int) -> None:
        await _read_request(reader)
        writer.write(b"SSH-2.0-not-http\r\n\r\n")
        await writer.drain()
        await reader.read()  # the client aborts the connection

    async with scripted_server(garbage) as (origin, _heads):
        ex = await pool.send(origin, "POST", "/generate", [], b"{}")
        with pytest.raises(UpstreamClosed, match="malformed response"):
            await ex.response()
        ex.close()
    pool.close()


@pytest.mark.parametrize(
    ("url", "origin", "prefix"),
    [
        ("http://127.0.0.1:30000", Origin("127.0.0.1", 30000), ""),
        ("http://engine/", Origin("engine", 80), ""),
        ("https://gw.example:8443/v1/base/", Origin("gw.example", 8443, tls=True), "/v1/base"),
        ("http://[::1]:9000/x", Origin("::1", 9000), "/x"),
    ],
)
def test_split_url(url: str, origin: Origin, prefix: str) -> None:
    assert split_url(url) == (origin, prefix)


@pytest.mark.parametrize("url", ["ftp://host:1", "127.0.0.1:8000", "http://:80", "http://host:port"])
def test_split_url_rejects_what_it_cannot_reach(url: str) -> None:
    with pytest.raises(ValueError, match="upstream URL"):
        split_url(url)


async def test_chunks_with_extensions_are_handed_over_one_by_one_as_they_arrive() -> None:
    received: list[bytes] = []
    next_chunk = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _conn: int) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            event = b"data: %d\n\n" % i
            writer.write(b'%x;name=value;flag;q="a b"\r\n%s\r\n' % (len(event), event))
            await writer.drain()
            await next_chunk.wait()  # the next chunk is sent only once the client saw this one
            next_chunk.clear()
        writer.write(b"0;last\r\nX-Checksum: 1\r\n\r\n")
        await writer.drain()

    pool = UpstreamPool()
    async with scripted_server(script) as (origin, _heads), asyncio.timeout(10):  # buffering would hang
        ex = await pool.send(origin, "POST", "/generate", [], b"{}")
        response = await ex.response()
        async for chunk in response.iter_chunks():
            received.append(chunk)
            next_chunk.set()
        assert response.complete and "X-Checksum" not in response.headers  # trailers are dropped
        ex.close()
    pool.close()
    assert received == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            "Transfer-Encoding can't be present with Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "Duplicate Content-Length"),
        (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\nab", "malformed response"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n", "malformed response"),
        (b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nab", "not an HTTP/1.x response"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabHTTP/1.1 200 OK\r\n\r\n",
            "after the end of the response",
        ),
    ],
    ids=[
        "length-and-chunked",
        "two-lengths",
        "obs-fold",
        "bad-chunk-size",
        "http2-status-line",
        "extra-answer",
    ],
)
async def test_ambiguous_or_malformed_answers_raise_instead_of_being_misread(
    answer: bytes, error: str
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _conn: int) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()  # the client aborts the connection

    pool = UpstreamPool()
    async with scripted_server(script) as (origin, _heads):
        ex = await pool.send(origin, "POST", "/generate", [], b"{}")
        with pytest.raises(UpstreamClosed, match=error):
            await (await ex.response()).read()
        ex.close()
    pool.close()


async def test_a_whole_body_larger_than_the_read_pause_is_read_to_its_end() -> None:
    # read() wants the whole body: pausing the socket while the body waits for it would wait forever
    body = b'{"padding": "' + b"x" * (4 << 20) + b'"}'

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: int) -> None:
        await _read_request(reader)
        writer.write(_ok(body))
        await writer.drain()

    async with scripted_server(script) as (origin, _heads):
        pool = UpstreamPool()
        try:
            exchange = await pool.send(origin, "GET", "/big", [], None)
            async with exchange:
                response = await exchange.response()
                async with asyncio.timeout(10):  # it waited forever
                    assert await response.read() == body
        finally:
            pool.close()
