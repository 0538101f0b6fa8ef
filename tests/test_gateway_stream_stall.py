"""A streaming client that stalls while the gateway writes a cut stream's final SSE error event.

Specification: the gateway counts that client under 499 ("client closed request") and logs the
stalled client, as it does for a client that stalls on any other write of its stream (before, the
final event's stall was swallowed and the request counted under the engine's 200).

Real HTTP on 127.0.0.1: a stand-in engine that streams one event, then what the test feeds it, then
cuts its connection; the gateway in this process (so the test can read how much of the client's
connection is buffered where); a client socket that reads the stream's first event and then
nothing. To make exactly the error event the write that waits, the test fills the kernel's socket
buffers and then the gateway's own write buffer to just below its high-water mark (Linux ioctls
give the bytes queued in the kernel); only then does the engine cut.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import sys
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from prefixfleet.router.gateway import GatewayConfig, listening
from prefixfleet.router.proxying import sse_error_event

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="socket queues are read with Linux ioctls"),
    pytest.mark.timeout(60),
]

WRITE_TIMEOUT_S = 0.5
SIOCOUTQNSD = 0x894B  # bytes in a socket's send queue not yet sent (linux/sockios.h)
FIRST_EVENT = b'data: {"choices": [{"text": "a"}]}\n\n'
# the gateway's error event once framed as a chunk (the exception's name varies by a few bytes)
ERROR_EVENT_BYTES = len(sse_error_event("worker stream ended early: UpstreamClosed")) + 8


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
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


def queued(fd: int, request: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, request, struct.pack("i", 0)))[0]


async def requests_counted(session: aiohttp.ClientSession, gateway: str) -> dict[str, float]:
    """The gateway's /v1/completions answers by status code, from its /metrics page."""
    async with session.get(f"{gateway}/metrics") as resp:
        text = await resp.text()
    counted = {}
    for line in text.splitlines():
        if line.startswith("prefixfleet_gateway_requests_total{") and 'endpoint="/v1/completions"' in line:
            code = line.split('code="', 1)[1].split('"', 1)[0]
            counted[code] = float(line.rsplit(" ", 1)[1])
    return counted


async def wait_for(condition, what: str, limit_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(limit_s / 0.01)):
        if await condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def test_a_client_stalling_on_the_final_error_event_is_counted_as_499(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prefixfleet.gateway")
    engine = CuttingEngine()
    loop = asyncio.get_running_loop()
    async with (
        engine.serving() as engine_url,
        listening(
            GatewayConfig(port=0, workers=(engine_url,), client_write_timeout_s=WRITE_TIMEOUT_S)
        ) as served,
        aiohttp.ClientSession() as session,
    ):
        gateway = f"http://127.0.0.1:{served.port}"
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel fills quickly
        client.setblocking(False)
        try:
            await loop.sock_connect(client, ("127.0.0.1", served.port))
            body = b'{"prompt": "hello", "stream": true, "max_tokens": 100}'
            await loop.sock_sendall(
                client,
                b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            )
            received = b""
            while FIRST_EVENT not in received:  # the stream began; from here the client reads nothing
                chunk = await loop.sock_recv(client, 65536)
                assert chunk, "the gateway closed the connection before the first event"
                received += chunk
            assert received.startswith(b"HTTP/1.1 200")
            (conn,) = served.front.connections  # the client's connection (probes went to aiohttp)
            transport = conn.transport
            gateway_fd = transport.get_extra_info("socket").fileno()
            high = transport.get_write_buffer_limits()[1]

            def forwarded() -> int:
                """Bytes the gateway wrote that the client has not read, wherever they wait."""
                return (
                    queued(client.fileno(), termios.FIONREAD)
                    + queued(gateway_fd, SIOCOUTQNSD)
                    + transport.get_write_buffer_size()
                )

            # Fill the kernel's buffers, then the gateway's to within one error event of its
            # high-water mark: every write so far returned at once, the error event's has to wait.
            for _ in range(200):
                room = high - transport.get_write_buffer_size()
                if 0 < room < ERROR_EVENT_BYTES:
                    break
                size = min(16384, room - ERROR_EVENT_BYTES // 2)
                before = forwarded()
                await engine.feed.put(b":" + b"x" * (size - 2) + b"\n")  # an SSE comment line

                async def passed_on(before: int = before, size: int = size) -> bool:
                    return forwarded() >= before + size

                await wait_for(passed_on, "the gateway to pass the engine's bytes on")
            room = high - transport.get_write_buffer_size()
            assert 0 < room < ERROR_EVENT_BYTES and not conn.write_paused, (room, high)
            counted_before = await requests_counted(session, gateway)

            await engine.feed.put(None)  # the engine cuts: the gateway writes the error event

            async def answered() -> bool:
                counted = await requests_counted(session, gateway)
                return sum(counted.values()) > sum(counted_before.values())

            await wait_for(answered, "the gateway to count the request")
            counted = await requests_counted(session, gateway)
            assert counted.get("499", 0) == counted_before.get("499", 0) + 1, counted
            assert counted.get("200", 0) == counted_before.get("200", 0), counted
            assert "read nothing of its stream" in caplog.text
            # and the client's connection was closed, not left open
            await wait_for(lambda: _closed(loop, client), "the gateway to close the client's connection")
        finally:
            client.close()


async def _closed(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bool:
    try:
        async with asyncio.timeout(0.05):
            while await loop.sock_recv(sock, 1 << 20):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True
