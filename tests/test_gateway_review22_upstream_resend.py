"""The upstream client re-sends a request on a new connection only when the reused connection may
have been closed by the server as idle, never after a server that had the request broke off.

A pooled connection that closed before any answer byte was always taken for a keep-alive connection
the server had closed while idle, and the request was written again on a new connection to the same
server. But a sidecar probes its engine's ``/health`` every second over the same pool, so its next
request nearly always goes out on a connection idle for under a second, which no server closes as
idle (uvicorn's keep-alive limit is 5 s): a close there means the engine read the request and broke
off. An engine that aborts a prompt's connection (a query of death) was then sent that prompt twice
by its own sidecar, and the gateway's one re-send elsewhere made it three engine hits, not two
(tests/test_failover_query_of_death.py, whose workers' order made that pass only by luck). Now only a
connection idle for at least ``STALE_AFTER_IDLE_S`` is re-sent once.

Real sockets on 127.0.0.1: a scripted server answering the first request of each connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from prefixfleet.router import upstream
from prefixfleet.router.upstream import Origin, UpstreamClosed, UpstreamPool

pytestmark = pytest.mark.timeout(60)


class OneAnswerPerConnection:
    """Answers the first request of each connection (keep-alive promised), then reads the next one
    and closes the connection without a byte: an engine that broke off after taking it."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str]] = []  # (connection number, request line)
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            for answered in (True, False):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                self.requests.append((conn, lines[0]))
                length = next(
                    (
                        int(v)
                        for n, _, v in (x.partition(":") for x in lines[1:])
                        if n.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                if answered:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(server: OneAnswerPerConnection) -> AsyncIterator[Origin]:
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    try:
        yield Origin("127.0.0.1", listener.sockets[0].getsockname()[1])
    finally:
        listener.close()
        await listener.wait_closed()


async def _get(pool: UpstreamPool, origin: Origin, target: str) -> bytes:
    async with await pool.send(origin, "GET", target, [], None) as exchange:
        return await (await exchange.response()).read()


async def test_a_request_the_server_broke_off_on_a_busy_connection_is_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # however long a loaded machine stalls between the two requests, the connection counts as busy
    monkeypatch.setattr(upstream, "STALE_AFTER_IDLE_S", 3600.0)
    server = OneAnswerPerConnection()
    pool = UpstreamPool()
    async with serving(server) as origin:
        assert await _get(pool, origin, "/health") == b"ok"  # leaves a keep-alive connection
        exchange = await pool.send(origin, "POST", "/generate", [], b'{"text": "poison"}')
        with pytest.raises(UpstreamClosed):
            await exchange.response()
        exchange.close()
    pool.close()
    assert upstream.reached_upstream(UpstreamClosed("x"))  # so a sidecar answers 502 "received"
    # before: (2, "POST /generate ...") too: the same server was sent it again on a new connection
    assert server.requests == [(1, "GET /health HTTP/1.1"), (1, "POST /generate HTTP/1.1")]


async def test_a_connection_idle_long_enough_for_an_idle_close_is_still_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream, "STALE_AFTER_IDLE_S", 0.05)  # instead of waiting 2 s
    server = OneAnswerPerConnection()
    pool = UpstreamPool()
    async with serving(server) as origin:
        assert await _get(pool, origin, "/health") == b"ok"
        await asyncio.sleep(0.1)
        # the server closes the reused connection as the request arrives (as an idle close racing
        # the write looks): written once more on a new connection, which answers
        assert await _get(pool, origin, "/again") == b"ok"
    pool.close()
    assert server.requests == [
        (1, "GET /health HTTP/1.1"),
        (1, "GET /again HTTP/1.1"),
        (2, "GET /again HTTP/1.1"),
    ]
