"""A streaming client that stalls while the sidecar writes a cut stream's final SSE error event.

Specification: the sidecar logs the stalled client once, in the words it uses for a client that
stalls on any other write of its stream (and the gateway uses for both), and closes its connection.
Before, the final event's stall was swallowed without a word. (The sidecar counts no answers by
status code, so there is no 499 to count, unlike the gateway.)

Same method as tests/test_gateway_stream_stall.py (shared in tests/stall_clients.py), with the
sidecar in the gateway's place: a stand-in engine that streams one event, then what the test feeds
it, then cuts its connection; a client that reads the first event and then nothing; the sidecar's
write buffers filled to just below its high-water mark, so exactly the error event's write waits.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
from stall_clients import CuttingEngine, closed, stalled_stream, wait_for

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
        async with (
            listening(config) as served,
            stalled_stream("sidecar", served.port, served.front, engine, ERROR_EVENT_BYTES) as stalled,
        ):
            assert STALL_LOG not in caplog.text

            await engine.feed.put(None)  # the engine cuts: the sidecar writes the error event

            async def logged() -> bool:
                return STALL_LOG in caplog.text

            await wait_for(logged, "the sidecar to log the stalled client")
            # and the client's connection was closed, not left open
            await wait_for(
                lambda: closed(loop, stalled.client), "the sidecar to close the client's connection"
            )
            stalls = [r for r in caplog.records if STALL_LOG in r.getMessage()]
            assert len(stalls) == 1, [r.getMessage() for r in stalls]
            assert stalls[0].name == "prefixfleet.sidecar"
            assert stalls[0].getMessage() == (
                "client of /v1/completions read nothing of its stream for 0.5 s: "
                "connection closed, request aborted"
            )
