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
import logging
import sys

import aiohttp
import pytest
from stall_clients import CuttingEngine, closed, stalled_stream, wait_for

from prefixfleet.router.gateway import GatewayConfig, listening
from prefixfleet.router.proxying import sse_error_event

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="socket queues are read with Linux ioctls"),
    pytest.mark.timeout(60),
]

WRITE_TIMEOUT_S = 0.5
# the gateway's error event once framed as a chunk (the exception's name varies by a few bytes)
ERROR_EVENT_BYTES = len(sse_error_event("worker stream ended early: UpstreamClosed")) + 8


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
        async with stalled_stream("gateway", served.port, served.front, engine, ERROR_EVENT_BYTES) as stalled:
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
            await wait_for(
                lambda: closed(loop, stalled.client), "the gateway to close the client's connection"
            )
