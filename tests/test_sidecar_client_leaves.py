"""The sidecar's own state-changing endpoints when their client leaves half-way (real processes).

aiohttp cancels the handler of a client that left (``handler_cancellation``: a proxied generation
request then stops on the engine too). Specification for the endpoints that change the sidecar's
state, so that a client giving up never leaves that state wrong:

* ``POST /prefixfleet/warm`` whose client (the autoscaler, with its timeout) leaves while the
  sidecar announces ``warming`` to a stalled Redis: the replica still ends ``ready`` (it stayed
  ``warming`` for good, so gateways sent it nothing again);
* ``/flush_cache`` whose client leaves while the engine is flushing: the engine's cache is empty
  once it answers, and so is the sidecar's mirror of it (it kept the old blocks, which gateways
  went on routing to as hits).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fleet_fixtures import LOOPBACK, RedisServer, Spawner, free_port, prefixfleet_argv, wait_until

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
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)  # stalled: announcing the state waits on it
    try:
        warm = {"source": f"http://{LOOPBACK}:{free_port()}", "hashes": ["0123456789abcdef"]}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while the state is announced
            httpx.post(f"{sidecar}/prefixfleet/warm", json=warm, timeout=httpx.Timeout(10, read=0.3))
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


@pytest.fixture
def slow_flush_engine() -> Iterator[tuple[str, list[float]]]:
    SlowFlushEngine.flushes = []
    server = ThreadingHTTPServer((LOOPBACK, free_port()), SlowFlushEngine)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}", SlowFlushEngine.flushes
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


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
