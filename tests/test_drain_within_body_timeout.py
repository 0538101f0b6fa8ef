"""Draining a refused body (router/proxying.py ``drain_refused_bodies``) stays within the services'
body timeout (``PREFIXFLEET_CLIENT_BODY_TIMEOUT_S``), as aiohttp's lingering close did
(``ClientTimeouts.runner_kwargs``: at most the body timeout).

Specification:
* ``DrainLimits.within(body_s)``: the idle and total limits are at most ``body_s``; the byte cap and
  larger timeouts are unchanged;
* the emulator, the sidecar and the gateway (in-process, 1 MiB limit, body timeout 1 s): a client
  declaring a Content-Length above the limit, which the service refuses at once (413), and then
  trickling a byte every 0.2 s is cut off after about the body timeout. Before, the drain read the
  trickle for its own 30 s, whatever the body timeout (a deployment shortening it against slow
  clients lost that bound for any refused upload). The test waits 20 s: far above the 1 s bound,
  below the 30 s of the old code.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from test_early_answer_drain import MAX_BODY, SERVICES, serving

from prefixfleet.router.proxying import DRAIN_LIMITS, DrainLimits
from prefixfleet.router.slow_clients import BODY_TIMEOUT_ENV

pytestmark = pytest.mark.timeout(120)

BODY_TIMEOUT_S = 1.0
CUT_WITHIN_S = 20.0  # the bound is BODY_TIMEOUT_S; the old code held the connection 30 s


def test_within_caps_the_timeouts_at_the_body_timeout() -> None:
    limits = DrainLimits(idle_s=5.0, total_s=30.0, max_bytes=1000)
    assert limits.within(2.0) == DrainLimits(idle_s=2.0, total_s=2.0, max_bytes=1000)
    assert limits.within(10.0) == DrainLimits(idle_s=5.0, total_s=10.0, max_bytes=1000)
    assert DRAIN_LIMITS.within(3600.0) == DRAIN_LIMITS


async def trickle_until_cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send a byte every 0.2 s until the server ends the connection (EOF or reset)."""
    while True:
        try:
            writer.write(b"x")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1024), 0.2) == b"":
                    return
        except (ConnectionError, OSError):
            return


@pytest.mark.parametrize("service", SERVICES)
async def test_a_trickled_refused_upload_is_cut_at_the_body_timeout(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BODY_TIMEOUT_ENV, str(BODY_TIMEOUT_S))
    async with serving(service) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (2 * MAX_BODY)
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30.0)
            assert head.startswith(b"HTTP/1.1 413"), head
            try:
                await asyncio.wait_for(trickle_until_cut(reader, writer), CUT_WITHIN_S)
            except TimeoutError:
                pytest.fail(f"a trickled refused upload held the connection over {CUT_WITHIN_S} s")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
