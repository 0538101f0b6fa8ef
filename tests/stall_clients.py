"""A streaming client that stalls with the server's write buffer one event short of full.

Shared by tests/test_gateway_stream_stall.py and tests/test_sidecar_stream_stall.py (real HTTP on
127.0.0.1, Linux ioctls): ``CuttingEngine`` is a stand-in engine that streams one event, then what
the test feeds it, then cuts its connection; ``stalled_stream`` opens a client that reads the
stream's first event and then nothing, and fills the kernel's socket buffers and then the server's
own write buffer to just below its high-water mark, so exactly the next (error) event's write waits.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from fleet_fixtures import serve_aiohttp

SIOCOUTQNSD = 0x894B  # bytes in a socket's send queue not yet sent (linux/sockios.h)
FIRST_EVENT = b'data: {"choices": [{"text": "a"}]}\n\n'


class CuttingEngine:
    """Streams one event, then every chunk put in ``feed``; ``None`` cuts its connection."""

    def __init__(self) -> None:
        self.feed: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(FIRST_EVENT)
        while (chunk := await self.feed.get()) is not None:
            await response.write(chunk)
        assert request.transport is not None
        request.transport.abort()  # the engine dies mid-stream
        return response

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        async with serve_aiohttp(app) as url:
            yield url


def queued(fd: int, request: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, request, struct.pack("i", 0)))[0]


async def wait_for(condition, what: str, limit_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(limit_s / 0.01)):
        if await condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def closed(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bool:
    try:
        async with asyncio.timeout(0.05):
            while await loop.sock_recv(sock, 1 << 20):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


@dataclass(frozen=True, slots=True)
class StalledStream:
    """The stalled client's socket and its connection on the server's front."""

    client: socket.socket
    conn: Any  # the front's connection object (private class of prefixfleet.router.front)


@asynccontextmanager
async def stalled_stream(
    server: str, port: int, front: Any, engine: CuttingEngine, error_event_bytes: int
) -> AsyncIterator[StalledStream]:
    """A client streaming ``/v1/completions`` through the server (named ``server`` in failures) on
    ``port``, reading nothing after the first event, with the server's buffers filled to within
    ``error_event_bytes`` of its high-water mark; the client's socket is closed when the block ends."""
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel fills quickly
    client.setblocking(False)
    try:
        await loop.sock_connect(client, ("127.0.0.1", port))
        body = b'{"prompt": "hello", "stream": true, "max_tokens": 100}'
        await loop.sock_sendall(
            client,
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
        )
        received = b""
        while FIRST_EVENT not in received:  # the stream began; from here the client reads nothing
            chunk = await loop.sock_recv(client, 65536)
            assert chunk, f"the {server} closed the connection before the first event"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        (conn,) = front.connections  # the client's connection (probes went to aiohttp)
        transport = conn.transport
        server_fd = transport.get_extra_info("socket").fileno()
        high = transport.get_write_buffer_limits()[1]

        def forwarded() -> int:
            """Bytes the server wrote that the client has not read, wherever they wait."""
            return (
                queued(client.fileno(), termios.FIONREAD)
                + queued(server_fd, SIOCOUTQNSD)
                + transport.get_write_buffer_size()
            )

        # Fill the kernel's buffers, then the server's to within one error event of its
        # high-water mark: every write so far returned at once, the error event's has to wait.
        for _ in range(200):
            room = high - transport.get_write_buffer_size()
            if 0 < room < error_event_bytes:
                break
            size = min(16384, room - error_event_bytes // 2)
            before = forwarded()
            await engine.feed.put(b":" + b"x" * (size - 2) + b"\n")  # an SSE comment line

            async def passed_on(before: int = before, size: int = size) -> bool:
                return forwarded() >= before + size

            await wait_for(passed_on, f"the {server} to pass the engine's bytes on")
        room = high - transport.get_write_buffer_size()
        assert 0 < room < error_event_bytes and not conn.write_paused, (room, high)
        yield StalledStream(client, conn)
    finally:
        client.close()
