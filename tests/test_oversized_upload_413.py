"""An upload above ``--max-body-bytes`` gets its 413 JSON answer, not a reset: gateway and sidecar
as real processes (with a real Valkey and the emulator behind them) on 127.0.0.1.

Specification:
* a client that sends a body above the limit, with a Content-Length or chunked, and pauses between
  its pieces for longer than the old drain budget (1 s in the handler, 2 s of aiohttp's lingering
  after the middleware's 413) but well within the idle timeout between pieces
  (:data:`~prefixfleet.router.proxying.DRAIN_LIMITS`, 5 s), reads the 413 in the OpenAI error
  shape once it has sent everything — an httpx client sends its whole body before it reads, so the
  server must keep reading (and dropping) while the client keeps sending, as nginx's lingering
  close does. Before the fix the server closed mid-upload and the client saw ``httpx.ReadError``
  every time: the pause makes that deterministic instead of depending on a loaded machine. The
  client is httpx's async one (as in the fuzz module's burst): the sync one, on Linux, still reads
  a 413 that arrived before the reset, but asyncio's transport drops the connection at the failed
  write and never reads it;
* the service then still serves a valid request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fleet_fixtures import LOOPBACK, RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.router.proxying import DRAIN_LIMITS

pytestmark = pytest.mark.timeout(120)

FLEET = "oversized"
MAX_BODY = 1024 * 1024
PIECE = 512 * 1024
# Longer than the old budgets (a fixed pause, so the old code failed every time, not only under
# load), and short of the idle timeout by a margin a loaded machine does not eat.
PAUSE_S = 2.5
assert DRAIN_LIMITS.idle_s - PAUSE_S >= 2.5


@dataclass
class Services:
    urls: dict[str, str]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    directory: Path = tmp_path_factory.mktemp("oversized")
    redis = RedisServer(free_port(), directory)
    redis.start()
    spawn = Spawner(directory)
    try:
        ports = {name: free_port() for name in ("engine", "sidecar", "gateway")}
        urls = {name: f"http://{LOOPBACK}:{port}" for name, port in ports.items()}
        spawn(
            prefixfleet_argv("emulator", "--port", str(ports["engine"]), "--time-scale", "1000"),
            name="engine", ready_url=f"{urls['engine']}/health",
        )  # fmt: skip
        spawn(
            prefixfleet_argv(
                "router", "sidecar", "--engine", urls["engine"], "--redis", redis.url,
                "--port", str(ports["sidecar"]), "--worker-id", "w0", "--fleet", FLEET,
                "--publish-interval", "0.1", "--max-body-bytes", str(MAX_BODY),
            ),
            name="sidecar", ready_url=f"{urls['sidecar']}/prefixfleet/status",
        )  # fmt: skip
        gateway = spawn(
            prefixfleet_argv(
                "router", "gateway", "--redis", redis.url, "--port", str(ports["gateway"]),
                "--fleet", FLEET, "--refresh-interval", "0.1", "--max-body-bytes", str(MAX_BODY),
            ),
            name="gateway",
        )  # fmt: skip
        wait_for_http(f"{urls['gateway']}/health", proc=gateway.proc)  # 200 once w0 is routable
        yield Services(urls)
        for child in spawn.children:
            assert "Traceback" not in child.log(), child.log()[-3000:]
    finally:
        spawn.stop_all()
        redis.stop()


async def paced_pieces(pieces: int) -> AsyncIterator[bytes]:
    """``pieces`` pieces of :data:`PIECE` bytes: the first three at once (past the limit, so the
    server answers 413 while the client is still sending), then one after each pause."""
    for i in range(pieces):
        if i >= 3:
            await asyncio.sleep(PAUSE_S)
        yield b"x" * PIECE


async def upload_then_valid(url: str, pieces: int, headers: dict[str, str]) -> tuple[httpx.Response, int]:
    """The oversized upload's answer, and the status of a valid request sent after it."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        resp = await client.post(url, content=paced_pieces(pieces), headers=headers)
        valid = await client.post(url, json={"prompt": "still here", "max_tokens": 1})
        return resp, valid.status_code


@pytest.mark.parametrize("service", ["gateway", "sidecar"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_slow_oversized_upload_reads_its_413(services: Services, service: str, framing: str) -> None:
    pieces = 5  # 2.5 MiB, the last two pieces after a pause each
    headers = {"Content-Type": "application/json"}
    if framing == "content-length":
        headers["Content-Length"] = str(pieces * PIECE)  # else httpx sends a generator chunked
    url = services.urls[service] + "/v1/completions"
    try:
        resp, valid_status = asyncio.run(upload_then_valid(url, pieces, headers))
    except httpx.TransportError as exc:
        pytest.fail(f"{service} ({framing}): the connection ended before the 413 was read: {exc!r}")
    assert resp.status_code == 413, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("body", 413)
    assert f"exceeds {MAX_BODY} bytes" in error["message"]
    assert resp.headers["Connection"] == "close"
    assert valid_status == 200
