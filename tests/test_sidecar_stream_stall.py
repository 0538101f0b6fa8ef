"""A streaming client that stalls while the sidecar writes a cut stream's final SSE error event.

Specification: the sidecar logs the stalled client once, in the words it uses for a client that
stalls on any other write of its stream (and the gateway uses for both), and closes its connection.
Before, the final event's stall was swallowed without a word. (The sidecar counts no answers by
status code, so there is no 499 to count, unlike the gateway.)

Same method as tests/test_gateway_stream_stall.py, with the sidecar in the gateway's place: a
stand-in engine that streams one event, then what the test feeds it, then cuts its connection; a
client that reads the first event and then nothing; the sidecar's write buffers filled to just
below its high-water mark, so exactly the error event's write waits.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import termios

import pytest
from test_gateway_stream_stall import FIRST_EVENT, SIOCOUTQNSD, CuttingEngine, _closed, queued, wait_for

from prefixfleet.router.proxying import sse_error_event
from prefixfleet.router.sidecar import SidecarConfig, listening

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="socket queues are read with Linux ioctls"),
    pytest.mark.timeout(60),
]

WRITE_TIMEOUT_S = 0.5
ERROR_EVENT_BYTES = len(sse_error_event("engine stream ended early: UpstreamClosed")) + 8
STALL_LOG = "read nothing of its stream"


async def test_a_client_stalling_on_the_final_error_event_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prefixfleet.sidecar")
    engine = CuttingEngine()
    loop = asyncio.get_running_loop()
    async with engine.serving() as engine_url:
        config = SidecarConfig(
            engine_url=engine_url,
            redis_url=None,
            port=0,
            worker_id="w0",
            model="m",
            revision="r",
            cache_tokens=20000,
            client_write_timeout_s=WRITE_TIMEOUT_S,
        )
        async with listening(config) as served:
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
                    assert chunk, "the sidecar closed the connection before the first event"
                    received += chunk
                assert received.startswith(b"HTTP/1.1 200")
                (conn,) = served.front.connections  # the client's connection
                transport = conn.transport
                sidecar_fd = transport.get_extra_info("socket").fileno()
                high = transport.get_write_buffer_limits()[1]

                def forwarded() -> int:
                    """Bytes the sidecar wrote that the client has not read, wherever they wait."""
                    return (
                        queued(client.fileno(), termios.FIONREAD)
                        + queued(sidecar_fd, SIOCOUTQNSD)
                        + transport.get_write_buffer_size()
                    )

                # Fill the kernel's buffers, then the sidecar's to within one error event of its
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

                    await wait_for(passed_on, "the sidecar to pass the engine's bytes on")
                room = high - transport.get_write_buffer_size()
                assert 0 < room < ERROR_EVENT_BYTES and not conn.write_paused, (room, high)
                assert STALL_LOG not in caplog.text

                await engine.feed.put(None)  # the engine cuts: the sidecar writes the error event

                async def logged() -> bool:
                    return STALL_LOG in caplog.text

                await wait_for(logged, "the sidecar to log the stalled client")
                # and the client's connection was closed, not left open
                await wait_for(lambda: _closed(loop, client), "the sidecar to close the client's connection")
                stalls = [r for r in caplog.records if STALL_LOG in r.getMessage()]
                assert len(stalls) == 1, [r.getMessage() for r in stalls]
                assert stalls[0].name == "prefixfleet.sidecar"
                assert stalls[0].getMessage() == (
                    "client of /v1/completions read nothing of its stream for 0.5 s: "
                    "connection closed, request aborted"
                )
            finally:
                client.close()
