"""The sidecar's own state-changing endpoints when their client leaves half-way (real processes).

aiohttp cancels the handler of a client that left (``handler_cancellation``: a proxied generation
request then stops on the engine too). Specification for the endpoints that change the sidecar's
state, so that a client giving up never leaves that state wrong:

* ``POST /prefixfleet/warm`` whose client (the autoscaler, with its timeout) leaves while the
  sidecar announces ``warming`` to a stalled Redis: the replica still ends ``ready`` (it stayed
  ``warming`` for good, so gateways sent it nothing again);
* ``/flush_cache`` whose client leaves while the engine is flushing: the engine's cache is empty
  once it answers, and so is the sidecar's mirror of it (it kept the old blocks, which gateways
  went on routing to as hits);
* a generation answer (served by aiohttp: a chunked request body) whose client leaves while the
  sidecar is still writing it: the engine did the work, so the sidecar still learns from its
  answer (the engine's cached-token report reconciles the mirror; it was skipped).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import struct
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import LOOPBACK, RedisServer, Spawner, free_port, prefixfleet_argv, serve_http, wait_until

from prefixfleet.router.keys import FleetKeys

pytestmark = pytest.mark.timeout(120)
FLUSH_ANSWER_DELAY_S = 1.0  # the engine answers the flush after its client (the sidecar's) left


def sidecar_status(url: str) -> dict:
    return httpx.get(f"{url}/prefixfleet/status", timeout=10).json()


def test_a_warm_whose_client_leaves_still_ends_with_the_replica_ready(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    engine_port, sidecar_port = free_port(), free_port()
    spawn(
        prefixfleet_argv("emulator", "--port", str(engine_port), "--cache-tokens", "20000"),
        name="engine", ready_url=f"http://{LOOPBACK}:{engine_port}/health",
    )  # fmt: skip
    sidecar = f"http://{LOOPBACK}:{sidecar_port}"
    spawn(
        prefixfleet_argv(
            "router", "sidecar", "--engine", f"http://{LOOPBACK}:{engine_port}", "--redis", redis_server.url,
            "--port", str(sidecar_port), "--worker-id", "w0", "--fleet", "leaves",
            "--publish-interval", "0.1",
        ),
        name="sidecar", ready_url=f"{sidecar}/prefixfleet/status",
    )  # fmt: skip
    # the autoscaler's token; the sidecar read it before it first registered, so it checks it with
    # Redis stalled below
    control = token_header(fleet_token_now(redis_server.url, "leaves"))
    members = FleetKeys("leaves").members
    wait_until(lambda: redis_server.client().hexists(members, "w0"), 20, "the sidecar to register")
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)  # stalled: announcing the state waits on it
    try:
        warm = {"source": f"http://{LOOPBACK}:{free_port()}", "hashes": ["0123456789abcdef"]}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while the state is announced
            httpx.post(
                f"{sidecar}/prefixfleet/warm", json=warm, headers=control, timeout=httpx.Timeout(10, read=0.3)
            )
        wait_until(
            lambda: sidecar_status(sidecar)["state"],
            20,
            "the replica to be ready after the warm its client left",
            done=lambda state: state == "ready",
        )
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)


class SlowFlushEngine(BaseHTTPRequestHandler):
    """An engine whose ``/flush_cache`` empties its cache at once but answers a while later."""

    flushes: list[float] = []

    def do_GET(self) -> None:
        if self.path == "/get_server_info":
            self._answer(200, {"served_model_name": "slow-flush", "max_total_num_tokens": 20000})
        elif self.path == "/get_model_info":
            self._answer(200, {})
        else:
            self._answer(200, {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/flush_cache":
            self.flushes.append(time.monotonic())
            time.sleep(FLUSH_ANSWER_DELAY_S)
            self._answer(200, {"flushed": True})
        else:  # /generate
            self._answer(200, {"text": "ok", "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}})

    def _answer(self, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # its client left
            return

    def log_message(self, *_args: object) -> None:
        return


class BigAnswerEngine(SlowFlushEngine):
    """An engine whose generation answers are larger than the socket buffers between the sidecar and
    a client that reads nothing (32 MB of padding), with SGLang's cached-token report."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        meta = {"prompt_tokens": 50, "completion_tokens": 1, "cached_tokens": 0}
        self._answer(200, {"text": "ok", "meta_info": meta, "padding": "x" * (32 << 20)})


@contextlib.contextmanager
def serve_engine(handler: type[SlowFlushEngine]) -> Iterator[str]:
    handler.flushes = []
    with serve_http(handler) as url:
        yield url


@pytest.fixture
def slow_flush_engine() -> Iterator[tuple[str, list[float]]]:
    with serve_engine(SlowFlushEngine) as url:
        yield url, SlowFlushEngine.flushes


@pytest.fixture
def big_answer_engine() -> Iterator[str]:
    with serve_engine(BigAnswerEngine) as url:
        yield url


def test_a_flush_whose_client_leaves_still_empties_the_mirror(
    spawn: Spawner, slow_flush_engine: tuple[str, list[float]]
) -> None:
    engine, flushes = slow_flush_engine
    port = free_port()
    sidecar = f"http://{LOOPBACK}:{port}"
    spawn(
        prefixfleet_argv("router", "sidecar", "--engine", engine, "--port", str(port), "--worker-id", "w0"),
        name="sidecar", ready_url=f"{sidecar}/prefixfleet/status",
    )  # fmt: skip
    prompt = {"text": "a prompt the mirror keeps " * 40, "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(f"{sidecar}/generate", json=prompt, timeout=10).status_code == 200
    assert sidecar_status(sidecar)["load"]["cached_tokens"] > 0
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while the engine flushes
        httpx.post(f"{sidecar}/flush_cache", timeout=httpx.Timeout(10, read=0.3))
    wait_until(lambda: len(flushes), 10, "the engine to flush")
    wait_until(
        lambda: sidecar_status(sidecar)["load"]["cached_tokens"],
        10,
        "the mirror to be empty like the engine's cache",
        done=lambda tokens: tokens == 0,
    )


def test_an_answer_whose_client_leaves_while_it_is_written_is_still_learned(
    spawn: Spawner, big_answer_engine: str
) -> None:
    port = free_port()
    sidecar = f"http://{LOOPBACK}:{port}"
    spawn(
        prefixfleet_argv("router", "sidecar", "--engine", big_answer_engine, "--port", str(port)),
        name="sidecar", ready_url=f"{sidecar}/prefixfleet/status",
    )  # fmt: skip
    body = json.dumps({"text": "a prompt " * 25, "sampling_params": {"max_new_tokens": 1}}).encode()
    with socket.create_connection((LOOPBACK, port), timeout=10) as conn:
        conn.sendall(
            b"POST /generate HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
        # the engine has answered (no request queued) and the sidecar is writing what nobody reads
        wait_until(
            lambda: sidecar_status(sidecar)["load"],
            30,
            "the sidecar to be writing the answer",
            done=lambda load: load["in_flight"] == 1 and load["queued"] == 0,
        )
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # leave: reset
    wait_until(
        lambda: sidecar_status(sidecar)["load"]["in_flight"],
        30,
        "the sidecar to count the request done",
        done=lambda n: n == 0,
    )
    assert sidecar_status(sidecar)["mirror"]["compared_requests"] == 1
