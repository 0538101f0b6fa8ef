"""An upstream that goes silent: a node that died without resetting its connections, or one that hangs.

Specification: every upstream connection the proxies open (gateway -> sidecar, sidecar -> engine)
has TCP keepalive on with a 30 s idle time, 10 s between probes and 3 probes, so the kernel ends a
connection to a dead peer in about a minute (before, never: a request in flight hung until its client
gave up). A peer alive to TCP but silent (hung) is given up after the read-idle limit
(``PREFIXFLEET_UPSTREAM_READ_TIMEOUT_S``, default 600 s, 0: none) before the head or between chunks:
the client gets a 504 naming it, not re-sent (the next worker would only be asked to wait as long),
counted as ``prefixfleet_gateway_errors_total{kind="timeout"}``.

Real sockets on 127.0.0.1; the silent upstream accepts, reads the request and never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from fleet_fixtures import free_port
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router.gateway import GatewayConfig, listening
from prefixfleet.router.sidecar import SidecarConfig
from prefixfleet.router.sidecar import listening as sidecar_listening
from prefixfleet.router.upstream import (
    DEFAULT_READ_TIMEOUT_S,
    READ_TIMEOUT_ENV,
    Origin,
    UpstreamPool,
    UpstreamTimeout,
    read_timeout_from_env,
)

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def silent_upstream() -> AsyncIterator[tuple[Origin, list[bytes]]]:
    """Accepts connections, reads what comes and never answers; yields its origin and what it read."""
    received: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                received.append(data)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield Origin("127.0.0.1", server.sockets[0].getsockname()[1]), received
    finally:
        for writer in writers:
            writer.transport.abort()
        server.close()
        await server.wait_closed()


def requests_in(received: list[bytes]) -> int:
    return b"".join(received).count(b"POST ")


async def test_upstream_sockets_have_tcp_keepalive() -> None:
    pool = UpstreamPool(read_timeout_s=None)
    async with silent_upstream() as (origin, _received):
        exchange = await pool.send(origin, "POST", "/generate", [], b"{}")
        assert exchange._conn is not None and exchange._conn.transport is not None
        sock = exchange._conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; the others' names differ
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        exchange.close()
    pool.close()


async def test_an_upstream_silent_past_the_read_limit_raises_upstream_timeout() -> None:
    pool = UpstreamPool(read_timeout_s=0.2)
    async with silent_upstream() as (origin, received):
        exchange = await pool.send(origin, "POST", "/generate", [], b"{}")
        with pytest.raises(UpstreamTimeout, match=r"sent nothing for 0\.2 s"):
            await exchange.response()
        exchange.close()
        assert requests_in(received) == 1
    pool.close()


def test_the_read_limit_comes_from_the_environment() -> None:
    assert read_timeout_from_env({}) == DEFAULT_READ_TIMEOUT_S == 600.0
    assert read_timeout_from_env({READ_TIMEOUT_ENV: "45"}) == 45.0
    assert read_timeout_from_env({READ_TIMEOUT_ENV: "0"}) is None
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match=READ_TIMEOUT_ENV):
            read_timeout_from_env({READ_TIMEOUT_ENV: bad})


async def gateway_metric(http: aiohttp.ClientSession, url: str, name: str, kind: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("kind") == kind:
                return sample.value
    raise AssertionError(f"no {name}{{kind={kind!r}}}")


async def test_a_silent_worker_gets_a_504_and_is_not_re_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(READ_TIMEOUT_ENV, "0.3")
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        origin, received = await stack.enter_async_context(silent_upstream())
        other_origin, other_received = await stack.enter_async_context(silent_upstream())
        workers = (f"http://{origin.authority}", f"http://{other_origin.authority}")
        served = await stack.enter_async_context(listening(GatewayConfig(port=0, workers=workers)))
        url = f"http://127.0.0.1:{served.port}"
        async with http.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as resp:
            assert resp.status == 504
            error = (await resp.json())["error"]
        assert error["type"] == "timeout" and "sent nothing for 0.3 s" in error["message"], error
        assert requests_in(received) + requests_in(other_received) == 1  # one worker asked, once
        assert await gateway_metric(http, url, "prefixfleet_gateway_errors_total", "timeout") == 1


async def test_a_sidecar_whose_engine_goes_silent_answers_504(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(READ_TIMEOUT_ENV, "0.3")
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        origin, received = await stack.enter_async_context(silent_upstream())
        port = free_port()
        config = SidecarConfig(
            engine_url=f"http://{origin.authority}",
            redis_url=None,
            port=port,
            worker_id="w",
            model="m",
            revision="r",
            cache_tokens=20000,
            prefill_tokens_per_s=30000.0,
        )
        await stack.enter_async_context(sidecar_listening(config))
        body = {"prompt": "hello", "max_tokens": 2}
        async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
            assert resp.status == 504
            assert "X-Prefixfleet-Retryable" not in resp.headers  # a gateway passes it on
            error = json.loads(await resp.read())["error"]
        assert error["type"] == "timeout" and "sent nothing for 0.3 s" in error["message"], error
        assert requests_in(received) == 1
