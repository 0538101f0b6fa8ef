"""A compressed request body costs memory in proportion to the body limit, not to what it decodes to.

A gzip or deflate body (router/content_coding.py, used by the gateway, the sidecar and the emulator)
is decoded and its decoded size bounded by the body limit (413). aiohttp's ``request.read()`` raises
the stream's buffer to the whole body limit before it reads, so its decoder inflated a body in
steps of the limit and buffered up to twice the limit before the size check ran: a 1 MB gzip bomb
grew the process by ~7x the limit (~220 MiB at the emulator's 32 MiB). Here a server process (the
emulator, 16 MiB limit) answers bombs that decode to 16x its limit; its peak resident memory (Linux
VmHWM, reset before each request) may grow by at most 2.5x the limit, and the answer is the usual
413 JSON error. A valid compressed body is still decoded and served by the same process.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_fixtures import free_port, wait_for_http

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux /proc"),
]

LIMIT = 8 * 1024 * 1024
DECODED = 8 * LIMIT  # what each bomb decodes to (~64 kB on the wire)
GROWTH_ALLOWED = LIMIT * 5 // 2
BODY_TIMEOUT_S = 1.0
SERVER = """
import asyncio, sys
from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer

async def main() -> None:
    await EmulatorServer(EmulatorConfig(max_body_bytes=int(sys.argv[1])), port=int(sys.argv[2])).start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


def compressed_spaces(size: int, wbits: int) -> bytes:
    """``size`` spaces compressed in the zlib container ``wbits`` names, built 1 MiB at a time."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = b" " * (1 << 20)
    return b"".join(encoder.compress(block) for _ in range(size >> 20)) + encoder.flush()


BOMBS: dict[str, Callable[[], bytes]] = {
    "gzip": lambda: compressed_spaces(DECODED, 16 + zlib.MAX_WBITS),
    "deflate": lambda: compressed_spaces(DECODED, zlib.MAX_WBITS),
}


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident memory) of process ``pid``, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def reset_peak(pid: int) -> None:
    """Restart VmHWM from the current RSS (Linux's clear_refs, value 5), so a startup peak does not hide
    the request's. Kernels without it keep the old peak: the growth read then errs low only when the
    startup peak was higher, which still shows a request's much larger growth."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def post(url: str, data: bytes, coding: str) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    port = free_port()
    log = tmp_path_factory.mktemp("bomb") / "emulator.log"
    with log.open("wb") as err:
        env = {**os.environ, "PREFIXFLEET_CLIENT_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)}
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(LIMIT), str(port)], stderr=err, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_http(url + "/health", timeout=20.0, proc=proc)
        yield proc.pid, url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("coding", sorted(BOMBS))
def test_a_compression_bomb_is_a_413_within_a_small_multiple_of_the_body_limit(
    emulator: tuple[int, str], coding: str
) -> None:
    pid, url = emulator
    bomb = BOMBS[coding]()
    assert len(bomb) < LIMIT // 32  # the wire size is far below the limit: only decoding exceeds it
    reset_peak(pid)
    before = memory_kib(pid)["VmRSS"]
    status, answer = post(url + "/generate", bomb, coding)
    growth_kib = memory_kib(pid)["VmHWM"] - before
    assert status == 413, answer
    assert answer["error"]["param"] == "body" and str(LIMIT) in answer["error"]["message"]
    assert growth_kib * 1024 <= GROWTH_ALLOWED, (
        f"peak RSS grew {growth_kib / 1024:.0f} MiB decoding a {coding} bomb at a "
        f"{LIMIT >> 20} MiB body limit (at most {GROWTH_ALLOWED / LIMIT:g}x the limit allowed)"
    )


@pytest.mark.parametrize(("coding", "encode"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_valid_compressed_body_is_still_decoded_and_served(
    emulator: tuple[int, str], coding: str, encode: Callable[[bytes], bytes]
) -> None:
    text = "hello " * 1000
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode()
    status, answer = post(emulator[1] + "/generate", encode(body), coding)
    assert status == 200, answer
    assert answer["meta_info"]["completion_tokens"] == 1 and answer["meta_info"]["prompt_tokens"] >= 1000


def test_a_compressed_body_trickled_too_slowly_is_still_a_408(emulator: tuple[int, str]) -> None:
    """The bounded read of a compressed body runs within the body deadline, as request.read() did."""
    port = int(emulator[1].rsplit(":", 1)[1])
    body = gzip.compress(b'{"text": "hello"}')
    head = (
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT_S + 10) as sock:
        sock.sendall(head.encode() + body[:10])  # the rest never comes
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert error["message"] == f"request body not received within {BODY_TIMEOUT_S:g} s"
