"""The gateway and sidecar facing clients that misbehave or give up (real processes on 127.0.0.1).

Specification:
* every 503 the gateway answers itself — no worker in the fleet, every worker draining, every worker
  failing, ``/v1/models`` with no worker, ``/health`` with nothing routable — carries
  ``Retry-After: 2`` (a failed worker sits out 2 s; there was none) and the same OpenAI error body;
* a request whose URL holds a non-ASCII byte (path or query; a generation path or another) gets a
  400 in the OpenAI error shape saying the URL must be ASCII, from the gateway and the sidecar, and
  one log line (it got aiohttp's plain-text 400 and an ERROR traceback in the log);
* with tenant isolation on, a number no double holds (``1e400``, ``-1e400``) or a ``NaN``/``Infinity``
  literal anywhere in the body is a 400 naming its field (the body was re-encoded with ``Infinity``,
  invalid JSON, and sent to the engine); ordinary numbers are routed as before;
* a streaming client that stops reading but keeps its connection open is cut off after
  ``--client-write-timeout`` (here 1 s) by the gateway — also when aiohttp serves the request (a
  chunked body) — and by the sidecar: its connection is closed, the engine's request aborted (the
  engine sees its connection end; before, it streamed on into full buffers for as long as the
  client stayed), the gateway counts it under 499 like a client that left, and each logs one line,
  no traceback;
* a request whose client leaves before its answer began (front or aiohttp) gives back the overlay
  blocks it added (the gateway's record of where it sent new prefixes; they stayed, counted as
  cached there, until the overlay TTL), while the blocks an earlier answered request sent there stay.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import (
    LOOPBACK,
    RedisServer,
    Spawned,
    Spawner,
    free_port,
    prefixfleet_argv,
    serve_http,
    wait_for_http,
    wait_until,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

FLEET = "robust"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
RETRY_AFTER = "2"
TENANT_HEADER = "X-Tenant"


@dataclass
class Fleet:
    children: list[Spawned]
    engine: str
    sidecar: str
    gateway: str
    tenant_gateway: str  # --tenant-header X-Tenant
    empty_gateway: str  # its fleet has no worker
    dead_gateway: str  # its only (static) worker refuses connections
    token: str  # the fleet's control token, read from its Redis as the operator does

    def log(self, name: str) -> str:
        return next(c for c in self.children if c.name == name).log()


def url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory: Path = tmp_path_factory.mktemp("robust")
    redis = RedisServer(free_port(), directory)
    redis.start()
    spawn = Spawner(directory)
    try:
        ports = {
            name: free_port()
            for name in ("engine", "sidecar", "gateway", "tenant", "empty", "dead", "closed")
        }
        spawn(
            prefixfleet_argv("emulator", "--port", str(ports["engine"]), "--cache-tokens", "20000"),
            name="engine", ready_url=f"{url(ports['engine'])}/health",
        )  # fmt: skip
        spawn(
            prefixfleet_argv(
                "router", "sidecar", "--engine", url(ports["engine"]), "--redis", redis.url,
                "--port", str(ports["sidecar"]), "--worker-id", "w0", "--fleet", FLEET,
                "--publish-interval", "0.1",
            ),
            name="sidecar", ready_url=f"{url(ports['sidecar'])}/prefixfleet/status",
        )  # fmt: skip
        for name, extra in (("gateway", ()), ("tenant", ("--tenant-header", TENANT_HEADER))):
            gateway = spawn(
                prefixfleet_argv(
                    "router", "gateway", "--redis", redis.url, "--port", str(ports[name]),
                    "--fleet", FLEET, "--refresh-interval", "0.1", *extra,
                ),
                name=name,
            )  # fmt: skip
            wait_for_http(f"{url(ports[name])}/health", proc=gateway.proc)  # 200 once w0 is routable
        for name, where in (
            ("empty", ("--redis", redis.url, "--fleet", "nobody")),
            ("dead", ("--worker", url(ports["closed"]))),  # nothing listens there
        ):
            proc = spawn(prefixfleet_argv("router", "gateway", "--port", str(ports[name]), *where), name=name)
            wait_for_http(f"{url(ports[name])}/livez", proc=proc.proc)
        yield Fleet(
            list(spawn.children),
            url(ports["engine"]),
            url(ports["sidecar"]),
            url(ports["gateway"]),
            url(ports["tenant"]),
            url(ports["empty"]),
            url(ports["dead"]),
            fleet_token_now(redis.url, FLEET),
        )
    finally:
        spawn.stop_all()
        redis.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(30.0)) as c:
        yield c


def chat(client: httpx.Client, base: str, body: dict | None = None) -> httpx.Response:
    return client.post(f"{base}/v1/chat/completions", json=body or CHAT)


def assert_unavailable(resp: httpx.Response, *words: str) -> None:
    assert resp.status_code == 503, resp.text[:300]
    assert resp.headers.get("retry-after") == RETRY_AFTER
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("service_unavailable", 503, None)
    for word in words:
        assert word in error["message"], error["message"]


def set_state(client: httpx.Client, fleet: Fleet, state: str) -> None:
    resp = client.post(
        f"{fleet.sidecar}/prefixfleet/state", json={"state": state}, headers=token_header(fleet.token)
    )
    assert resp.status_code == 200, resp.text


def test_every_503_of_the_gateway_says_when_to_retry(fleet: Fleet, client: httpx.Client) -> None:
    assert_unavailable(chat(client, fleet.empty_gateway), "no worker")
    assert_unavailable(client.get(f"{fleet.empty_gateway}/v1/models"), "no worker")
    health = client.get(f"{fleet.empty_gateway}/health")
    assert (health.status_code, health.headers.get("retry-after")) == (503, RETRY_AFTER)
    # every worker failing: the retries run out
    assert_unavailable(chat(client, fleet.dead_gateway))
    # every worker draining
    set_state(client, fleet, "draining")
    try:
        wait_until(
            lambda: chat(client, fleet.gateway).status_code, 20, "the gateway to see w0 draining",
            done=lambda status: status == 503,
        )  # fmt: skip
        assert_unavailable(chat(client, fleet.gateway), "no worker")
    finally:
        set_state(client, fleet, "ready")
    ok = wait_until(
        lambda: chat(client, fleet.gateway), 20, "the gateway to route to w0 again",
        done=lambda resp: resp.status_code == 200,
    )  # fmt: skip
    assert "retry-after" not in ok.headers


def raw_exchange(base: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as bytes on a new connection; the answer, read to the connection's end."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize(
    "target",
    [b"/v1/chat/completions?user=caf\xc3\xa9", b"/v1/chat/compl\xffetions", b"/prefixfleet/st\xe9tus"],
    ids=["query", "generation-path", "other-path"],
)
def test_a_non_ascii_byte_in_the_url_is_a_json_400_without_a_traceback(
    fleet: Fleet, client: httpx.Client, target: bytes
) -> None:
    body = json.dumps(CHAT).encode()
    request = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    for name, base in (("gateway", fleet.gateway), ("sidecar", fleet.sidecar)):
        status, headers, answer = raw_exchange(base, request % (target, len(body), body))
        assert status == 400, answer[:300]
        assert headers["content-type"].startswith("application/json")
        error = json.loads(answer)["error"]
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, 400)
        assert "URL must be ASCII" in error["message"], error["message"]
        log = wait_until(
            lambda name=name: fleet.log(name), 10, f"the {name} to log the refusal",
            done=lambda text: "refused a malformed request" in text,
        )  # fmt: skip
        assert "Traceback" not in log and " ERROR " not in log, log[-2000:]
    assert chat(client, fleet.gateway).status_code == 200  # still serving


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("temperature", b"1e400"),
        ("logit_bias.50256", b"-1e400"),
        ("messages[0].weight", b"NaN"),
        ("top_p", b"Infinity"),
    ],
)
def test_with_tenant_isolation_a_number_json_cannot_carry_is_a_400_naming_its_field(
    fleet: Fleet, client: httpx.Client, field: str, text: bytes
) -> None:
    bodies = {
        "temperature": b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":%s}',
        "logit_bias.50256": b'{"messages":[{"role":"user","content":"hi"}],"logit_bias":{"50256":%s}}',
        "messages[0].weight": b'{"messages":[{"role":"user","content":"hi","weight":%s}],"max_tokens":2}',
        "top_p": b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"top_p":%s}',
    }
    resp = client.post(
        f"{fleet.tenant_gateway}/v1/chat/completions",
        content=bodies[field] % text,
        headers={"Content-Type": "application/json", TENANT_HEADER: "acme"},
    )
    assert resp.status_code == 400, resp.text[:300]
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", field, 400)
    assert f"{field} is not a finite number" in error["message"], error["message"]
    ordinary = client.post(
        f"{fleet.tenant_gateway}/v1/chat/completions",
        content=bodies[field] % b"0.5",
        headers={"Content-Type": "application/json", TENANT_HEADER: "acme"},
    )
    assert ordinary.status_code == 200, ordinary.text[:300]


STREAM_LIMIT_S = 60.0  # the stand-in engine streams at most this long (bounded; tests wait 20 s)


class EndlessStreamEngine(BaseHTTPRequestHandler):
    """An engine streaming 1 KB SSE events as fast as its client takes them, for up to a minute;
    it records each stream its client (the sidecar) cut off."""

    aborted: list[float] = []
    started: list[float] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        info = {"served_model_name": "endless", "max_total_num_tokens": 20000}
        data = json.dumps(info if self.path == "/get_server_info" else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends with the connection
        event = b'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n' % (b"x" * 1000)
        with self.lock:
            self.started.append(time.monotonic())
        deadline = time.monotonic() + STREAM_LIMIT_S
        try:
            while time.monotonic() < deadline:
                self.wfile.write(event)
        except OSError:
            with self.lock:
                self.aborted.append(time.monotonic())

    def log_message(self, *_args: object) -> None:
        return


@dataclass
class StallFleet:
    children: list[Spawned]
    gateway: str  # --client-write-timeout 1, in front of a sidecar with the default (60 s)
    sidecar: str  # --client-write-timeout 1

    def log(self, name: str) -> str:
        return next(c for c in self.children if c.name == name).log()


@pytest.fixture(scope="module")
def stall_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StallFleet]:
    directory: Path = tmp_path_factory.mktemp("stall")
    spawn = Spawner(directory)
    EndlessStreamEngine.aborted, EndlessStreamEngine.started = [], []
    with serve_http(EndlessStreamEngine) as engine:
        try:
            ports = {name: free_port() for name in ("behind", "gateway", "sidecar")}
            for name, extra in (("behind", ()), ("sidecar", ("--client-write-timeout", "1"))):
                spawn(
                    prefixfleet_argv(
                        "router", "sidecar", "--engine", engine, "--port", str(ports[name]),
                        "--worker-id", name, *extra,
                    ),
                    name=name, ready_url=f"{url(ports[name])}/prefixfleet/status",
                )  # fmt: skip
            gateway = spawn(
                prefixfleet_argv(
                    "router", "gateway", "--port", str(ports["gateway"]), "--worker", url(ports["behind"]),
                    "--client-write-timeout", "1",
                ),
                name="gateway",
            )  # fmt: skip
            wait_for_http(f"{url(ports['gateway'])}/health", proc=gateway.proc)
            yield StallFleet(list(spawn.children), url(ports["gateway"]), url(ports["sidecar"]))
        finally:
            spawn.stop_all()


def metric(client: httpx.Client, base: str, line_start: str) -> float:
    for line in client.get(f"{base}/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def read_to_end(conn: socket.socket) -> bool:
    """Read what is left; True once the connection ended (closed or reset), False if it stays open."""
    try:
        while conn.recv(1 << 20):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(
    ("target", "framing"),
    [("gateway", "content-length"), ("gateway", "chunked"), ("sidecar", "content-length")],
    ids=["gateway", "gateway-aiohttp", "sidecar"],
)
def test_a_streaming_client_that_stops_reading_is_cut_off_and_the_engine_request_aborted(
    stall_fleet: StallFleet, client: httpx.Client, target: str, framing: str
) -> None:
    base = getattr(stall_fleet, target)
    closed_before = metric(
        client, stall_fleet.gateway,
        'prefixfleet_gateway_requests_total{code="499",endpoint="/v1/chat/completions"}',
    )  # fmt: skip
    started, aborted = len(EndlessStreamEngine.started), len(EndlessStreamEngine.aborted)
    body = json.dumps({**CHAT, "stream": True}).encode()
    if framing == "chunked":  # the front hands it to aiohttp
        framed = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        framed = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    host, port = base.removeprefix("http://").split(":")
    with socket.socket() as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        conn.settimeout(10)
        conn.connect((host, int(port)))
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + framed
        )
        assert conn.recv(64).startswith(b"HTTP/1.1 200"), "the stream began"
        wait_until(lambda: len(EndlessStreamEngine.started) > started, 20, "the engine to start streaming")
        # ... and the client reads nothing more while its connection stays open
        wait_until(
            lambda: len(EndlessStreamEngine.aborted) > aborted, 20,
            "the engine's request to be aborted after the client stopped reading",
        )  # fmt: skip
        assert read_to_end(conn), "the proxy closed the connection"
    log = wait_until(
        lambda: stall_fleet.log(target), 10, f"the {target} to log the stalled client",
        done=lambda text: "read nothing of its stream" in text,
    )  # fmt: skip
    assert "Traceback" not in log and " ERROR " not in log, log[-2000:]
    if target == "gateway":
        closed = metric(
            client, stall_fleet.gateway,
            'prefixfleet_gateway_requests_total{code="499",endpoint="/v1/chat/completions"}',
        )  # fmt: skip
        assert closed == closed_before + 1
    else:
        status = client.get(f"{stall_fleet.sidecar}/prefixfleet/status").json()
        assert status["load"]["in_flight"] == 0


class HoldingEngine(BaseHTTPRequestHandler):
    """An engine answering ``max_tokens: 1`` at once and holding any other request, unanswered,
    until its client leaves (at most ``STREAM_LIMIT_S``)."""

    def do_GET(self) -> None:
        self._answer({"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if body.get("max_tokens") == 1:
            self._answer({"choices": [{"text": "ok"}]})
            return
        self.connection.settimeout(0.1)
        deadline = time.monotonic() + STREAM_LIMIT_S
        while time.monotonic() < deadline:
            try:
                if not self.connection.recv(1):
                    return  # its client (the gateway) left
            except TimeoutError:
                continue
            except OSError:
                return

    def _answer(self, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        return


def static_gateway(spawn: Spawner, engine: str) -> str:
    """The base URL of a gateway process routing to ``engine`` alone (a static worker), once healthy."""
    port = free_port()
    proc = spawn(prefixfleet_argv("router", "gateway", "--port", str(port), "--worker", engine), name="gw")
    wait_for_http(f"{url(port)}/health", proc=proc.proc)
    return url(port)


def overlay_blocks(client: httpx.Client, gateway: str) -> int:
    (worker,) = client.get(f"{gateway}/prefixfleet/view").json()["workers"]
    return worker["overlay_blocks"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])  # chunked: aiohttp serves it
def test_a_send_whose_client_left_before_its_answer_gives_back_its_overlay_blocks(
    spawn: Spawner, client: httpx.Client, framing: str
) -> None:
    with serve_http(HoldingEngine) as engine:
        gateway = static_gateway(spawn, engine)
        shared = " ".join(f"shared{i}" for i in range(64))
        answered = client.post(f"{gateway}/v1/completions", json={"prompt": shared, "max_tokens": 1})
        assert answered.status_code == 200, answered.text
        kept = overlay_blocks(client, gateway)
        assert kept > 0
        body = json.dumps({"prompt": shared + " " + " ".join(f"new{i}" for i in range(64))}).encode()
        host, gw_port = gateway.removeprefix("http://").split(":")
        with socket.create_connection((host, int(gw_port)), timeout=10) as conn:
            if framing == "chunked":
                framed = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            else:
                framed = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            conn.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + framed
            )
            wait_until(lambda: overlay_blocks(client, gateway) > kept, 20, "the gateway to record the send")
        # the client left before any answer: its new blocks go, the earlier request's stay
        wait_until(
            lambda: overlay_blocks(client, gateway), 20, "the overlay to give back the abandoned send",
            done=lambda blocks: blocks == kept,
        )  # fmt: skip


WRITE_TIMEOUT_S = 1.0  # the stall fleet's --client-write-timeout


@pytest.mark.parametrize(
    ("target", "framing"),
    [("gateway", "content-length"), ("gateway", "chunked"), ("sidecar", "content-length")],
    ids=["gateway", "gateway-aiohttp", "sidecar"],
)
def test_a_slow_streaming_client_that_keeps_reading_is_not_cut_off(
    stall_fleet: StallFleet, target: str, framing: str
) -> None:
    """The write timeout is a no-progress limit: a reader far slower than the engine (1 KB every
    50 ms) makes each write wait far longer than the limit for the proxy's buffers to drain (the
    kernel's send buffer alone is megabytes), yet it takes bytes all along and keeps its stream. The
    proxy's log says whether it cut the stream: the client would go on reading what the kernels
    buffered for a while after a cut."""
    base = getattr(stall_fleet, target)
    cut_before = stall_fleet.log(target).count("read nothing of its stream")
    body = json.dumps({**CHAT, "stream": True}).encode()
    if framing == "chunked":  # the front hands it to aiohttp
        framed = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        framed = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    host, port = base.removeprefix("http://").split(":")
    with socket.socket() as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.settimeout(10)
        conn.connect((host, int(port)))
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + framed
        )
        assert conn.recv(64).startswith(b"HTTP/1.1 200"), "the stream began"
        received = 0
        deadline = time.monotonic() + 3 * WRITE_TIMEOUT_S  # three limits long
        while time.monotonic() < deadline:
            data = conn.recv(1024)
            assert data, f"the {target} closed the stream of a client still reading ({received} bytes in)"
            received += len(data)
            time.sleep(0.05)
        log = stall_fleet.log(target)
    assert log.count("read nothing of its stream") == cut_before, log[-2000:]


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["gateway", "--client-write-timeout", "0"], {}, "--client-write-timeout must be a positive number"),
        (["sidecar", "--client-write-timeout", "-1"], {}, "--client-write-timeout must be a positive number"),
        (["gateway"], {"PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S": "0"}, "PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S must"),
        (
            ["sidecar"],
            {"PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S": "soon"},
            "PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S must",
        ),
        (["gateway"], {"PREFIXFLEET_CLIENT_BODY_TIMEOUT_S": "-3"}, "PREFIXFLEET_CLIENT_BODY_TIMEOUT_S must"),
    ],
    ids=["flag-zero", "flag-negative", "env-zero", "env-text", "body-env"],
)
def test_a_write_timeout_that_is_not_a_positive_number_is_refused_in_one_line(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    """0 is not "off": every stream has a limit. The variables are read at start-up and refused
    there in one line, like the flags (they were a traceback from the starting service)."""
    service = argv[0]
    where = ["--worker", "http://127.0.0.1:1"] if service == "gateway" else ["--engine", "http://127.0.0.1:1"]
    done = subprocess.run(
        prefixfleet_argv("router", *argv, *where, "--port", str(free_port())),
        capture_output=True, text=True, timeout=30, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


class OverloadedEngine(BaseHTTPRequestHandler):
    """An engine answering every generation 503, with ``Retry-After: 7`` when asked for 7 tokens."""

    def do_GET(self) -> None:
        self._answer(200, {"status": "ok"}, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        error = {"error": {"message": "engine overloaded", "type": "overloaded", "param": None, "code": 503}}
        self._answer(503, error, {"Retry-After": "7"} if body.get("max_tokens") == 7 else {})

    def _answer(self, status: int, obj: object, headers: dict[str, str]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json"}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        return


def test_an_engines_503_passes_through_with_its_own_retry_after_or_none(
    spawn: Spawner, client: httpx.Client
) -> None:
    """Only the 503s the gateway makes itself get its Retry-After: an engine's answer is the
    engine's, header and body."""
    with serve_http(OverloadedEngine) as engine:
        gateway = static_gateway(spawn, engine)
        plain = chat(client, gateway)
        assert plain.status_code == 503, plain.text
        assert plain.json()["error"]["message"] == "engine overloaded"
        assert "retry-after" not in plain.headers
        own = chat(client, gateway, {**CHAT, "max_tokens": 7})
        assert (own.status_code, own.headers.get("retry-after")) == (503, "7")
        assert own.json()["error"]["type"] == "overloaded"


def test_a_send_that_left_keeps_the_blocks_a_concurrent_send_of_its_prefix_holds(
    spawn: Spawner, client: httpx.Client
) -> None:
    """Two sends of one prefix to one worker, both held by the engine: the longer one's client
    leaves, and only the blocks past the other's go; the other's stay, counted as cached there."""
    with serve_http(HoldingEngine) as engine:
        gateway = static_gateway(spawn, engine)
        shared = " ".join(f"shared{i}" for i in range(64))
        longer = shared + " " + " ".join(f"more{i}" for i in range(64))
        host, gw_port = gateway.removeprefix("http://").split(":")

        def send_held(prompt: str) -> socket.socket:
            body = json.dumps({"prompt": prompt}).encode()
            conn = socket.create_connection((host, int(gw_port)), timeout=10)
            conn.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return conn

        with send_held(shared):
            held = wait_until(
                lambda: overlay_blocks(client, gateway), 20, "the gateway to record the first send",
                done=lambda blocks: blocks > 0,
            )  # fmt: skip
            with send_held(longer):
                wait_until(
                    lambda: overlay_blocks(client, gateway) > held,
                    20,
                    "the gateway to record the second send",
                )
            # the longer send's client left: its own blocks go, the held first send's stay
            wait_until(
                lambda: overlay_blocks(client, gateway), 20, "the overlay to give back the longer send",
                done=lambda blocks: blocks == held,
            )  # fmt: skip
            assert overlay_blocks(client, gateway) == held
