"""The bounds on draining a refused (413) body (router/proxying.py ``drain_refused_bodies``), on an
aiohttp app with the services' body middleware, served on 127.0.0.1 in a thread; clients are plain
blocking sockets (they read only after sending, like httpx).

Specification:
* a body above the limit that ends within the limits is read to its end: the client reads the 413
  and then the connection's clean end (no reset);
* a client that stops sending (without closing) is cut off after the idle timeout between pieces;
* one that keeps trickling is cut off at the total time, however short its pauses;
* one that keeps sending fast is cut off once ``max_bytes`` past the limit were dropped;
* a declared Content-Length more than ``max_bytes`` past what had arrived when it was answered is
  answered and closed at once, without waiting for the body;
* the rule for that (:func:`worth_draining`) on plain numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from prefixfleet.router.proxying import DrainLimits, drain_refused_bodies, json_error, worth_draining
from prefixfleet.router.slow_clients import ClientTimeouts, body_deadline

pytestmark = pytest.mark.timeout(90)

LIMIT = 64 * 1024
PIECE = 16 * 1024
# Every wait the server must not reach in a test is far above what the test waits for.
LONG_S = 120.0
WAIT_S = 30.0  # how long a client waits for what the server does at once, or within a short limit


def _body_error(_request: web.Request, status: int, message: str) -> web.Response:
    return json_error(status, message, param="body")


async def _echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


@contextlib.contextmanager
def serving(limits: DrainLimits) -> Iterator[int]:
    """An app refusing bodies above :data:`LIMIT` as the gateway and sidecar do; yields its port."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port: list[int] = []
    stop = asyncio.Event()

    async def serve() -> None:
        timeouts = ClientTimeouts(body_s=LONG_S, idle_s=LONG_S)
        app = web.Application(
            client_max_size=LIMIT,
            middlewares=[drain_refused_bodies(limits), body_deadline(timeouts, _body_error)],
        )
        app.router.add_post("/echo", _echo)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, **timeouts.runner_kwargs())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(runner.addresses[0][1])
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(WAIT_S), "the test server did not start"
    try:
        yield port[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(WAIT_S)


@contextlib.contextmanager
def connected(limits: DrainLimits) -> Iterator[socket.socket]:
    """A client socket connected to a :func:`serving` app."""
    with serving(limits) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        yield sock


def _head(length: int | None) -> bytes:
    framing = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    return b"POST /echo HTTP/1.1\r\nHost: t\r\n" + framing + b"\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _read_all(sock: socket.socket) -> tuple[bytes, str]:
    """Everything the server sent, and how the connection ended: 'eof', 'reset' or 'open' (still
    open after :data:`WAIT_S`)."""
    sock.settimeout(WAIT_S)
    received = b""
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return received, "open"
        except ConnectionResetError:
            return received, "reset"
        if not data:
            return received, "eof"
        received += data


def _send_until_refused(sock: socket.socket, piece: bytes, pieces: int, pause_s: float = 0.0) -> int:
    """Send up to ``pieces`` copies of ``piece``; how many went before the server refused more."""
    for sent in range(pieces):
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return sent
        if pause_s:
            time.sleep(pause_s)
    return pieces


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_ending_within_the_limits_is_drained_and_its_413_read(chunked: bool) -> None:
    pieces = 4 * LIMIT // PIECE  # 4x the limit, sent in two halves with a pause
    with connected(DrainLimits(idle_s=LONG_S, total_s=LONG_S)) as sock:
        piece = _chunk(b"x" * PIECE) if chunked else b"x" * PIECE
        sock.sendall(_head(None if chunked else pieces * PIECE) + piece * (pieces // 2))
        time.sleep(0.5)  # the 413 is out by now on an idle machine; on a loaded one, no matter
        sock.sendall(piece * (pieces // 2) + (b"0\r\n\r\n" if chunked else b""))
        answer, end = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"Connection: close" in answer and f"exceeds {LIMIT} bytes".encode() in answer
    assert end == "eof"  # the whole body was read: a clean close, not a reset


def test_a_client_that_stops_sending_is_cut_off_after_the_idle_timeout() -> None:
    with connected(DrainLimits(idle_s=0.5, total_s=LONG_S)) as sock:
        sock.sendall(_head(4 * LIMIT) + b"x" * 2 * LIMIT)  # half the body, then nothing
        answer, end = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert end in ("eof", "reset")  # not "open": the server did not wait for the rest


def test_a_trickling_client_is_cut_off_at_the_total_time() -> None:
    # a piece every 50 ms never meets the idle timeout: only the total time can end the drain
    with connected(DrainLimits(idle_s=LONG_S, total_s=1.0)) as sock:
        sock.sendall(_head(None) + _chunk(b"x" * 2 * LIMIT))
        pieces = int(WAIT_S / 0.05)
        sent = _send_until_refused(sock, _chunk(b"t" * 64), pieces, pause_s=0.05)
        answer, _ = _read_all(sock)
    assert sent < pieces, "the server kept reading a trickle past its total time"
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_a_fast_client_is_cut_off_past_the_byte_cap() -> None:
    with connected(DrainLimits(idle_s=LONG_S, total_s=LONG_S, max_bytes=4 * LIMIT)) as sock:
        sock.sendall(_head(None))
        piece = _chunk(b"x" * 256 * 1024)
        pieces = 256  # 64 MiB: far more than the cap plus what the sockets' buffers hold
        sent = _send_until_refused(sock, piece, pieces)
        answer, _ = _read_all(sock)
    assert sent < pieces, "the server kept reading past its byte cap"
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_a_declared_length_far_past_the_cap_is_answered_and_closed_at_once() -> None:
    limits = DrainLimits(idle_s=LONG_S, total_s=LONG_S, max_bytes=4 * LIMIT)
    with connected(limits) as sock:
        # past the limit, then the client waits: a drain would wait LONG_S for the rest. The cap
        # counts from what had arrived when the 413 went out (at the head since the declared length
        # is refused unread, up to the 2 * LIMIT sent): the rest is past the cap however much that was
        sock.sendall(_head(2 * LIMIT + limits.max_bytes + 1) + b"x" * 2 * LIMIT)
        answer, end = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert end in ("eof", "reset")


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        (None, True),  # chunked: drained, and cut at the cap
        (LIMIT + 1, True),
        (LIMIT + 1000, True),
        (LIMIT + 1000 + 1, False),
        (10**15, False),
    ],
)
def test_worth_draining_up_to_max_bytes_past_the_limit(declared: int | None, expected: bool) -> None:
    assert worth_draining(declared, LIMIT, DrainLimits(max_bytes=1000)) is expected
