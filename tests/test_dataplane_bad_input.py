"""Bad input on every HTTP surface a client or an operator hits: gateway and sidecar as real processes.

Specification (each row below is one request; the services are a real Valkey, the emulator, a
sidecar and a gateway on 127.0.0.1):
* the gateway's generation endpoints answer malformed JSON, JSON that is not an object, wrong
  types, missing fields, a non-UTF-8 body and a body above ``--max-body-bytes`` with a 4xx in the
  OpenAI error shape (``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``)
  whose ``param`` and message name what is wrong; what only the engine judges (``max_tokens`` above
  its limit) is passed through as the engine's 4xx;
* the sidecar's own endpoints (``/prefixfleet/warm``, ``/prefixfleet/state``,
  ``/prefixfleet/prefix/{hash}``) do the same: a body nested too deeply (it answered 500 on
  ``/warm``), a Content-Type naming an unknown charset (JSON is UTF-8 whatever it says; both
  answered 500, LookupError), a non-UTF-8 body, a bad hash, wrong field types (now with ``param``);
* a wrong method on a sidecar path under ``/prefixfleet/`` is a 405 naming the allowed ones (with
  ``Allow``), an unknown one a 404 naming the path, both answered by the sidecar in the same JSON
  shape (they went to the engine, which answered a bare 404 "Not Found");
* a warm-up whose source sidecar answers junk for a prefix (JSON nested too deeply: it answered
  500; not JSON; no token ids; an error status) reports that prefix as failed with the reason;
* a request whose head has bare-LF line ends (or a CR CR LF blank line) is answered 400 at once by
  the gateway and the sidecar, as by aiohttp (their lean front waited for a CRLF blank line: no
  answer until the idle limit), while a valid head arriving byte by byte is still served;
* a request body in a coding the services do not decode (``br``, ``zstd``, any other, or a list of
  codings) is a 415 naming it, with ``Accept-Encoding: gzip, deflate``; a ``gzip`` or ``deflate``
  body is decoded whichever path serves it; one that does not decode as its coding is a 400;
* afterwards every process is up, still serves a valid request, and no log holds a traceback.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
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
)

pytestmark = pytest.mark.timeout(120)

FLEET = "badinput"
MAX_BODY = 100_000
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"
JSON = {"Content-Type": "application/json"}


@dataclass
class Services:
    children: list[Spawned]
    sidecar: str
    gateway: str
    token: str  # the fleet's control token, read from its Redis as the operator does

    def control(self, headers: dict[str, str] | None = None) -> dict[str, str]:
        """``headers`` and the control token, for the sidecar's control routes."""
        return {**(headers or {}), **token_header(self.token)}

    def url(self, service: str) -> str:
        return self.gateway if service == "gateway" else self.sidecar


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    directory: Path = tmp_path_factory.mktemp("badinput")
    redis = RedisServer(free_port(), directory)
    redis.start()
    spawn = Spawner(directory)
    # a head that never completes would be closed only after this: an answer within the client's
    # 10 s read timeout below is then the front's own, not the idle limit's
    env = {"PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S": "60"}
    try:
        ports = {name: free_port() for name in ("engine", "sidecar", "gateway")}
        url = {name: f"http://{LOOPBACK}:{port}" for name, port in ports.items()}
        spawn(
            prefixfleet_argv("emulator", "--port", str(ports["engine"]), "--cache-tokens", "20000"),
            name="engine", ready_url=f"{url['engine']}/health",
        )  # fmt: skip
        spawn(
            prefixfleet_argv(
                "router", "sidecar", "--engine", url["engine"], "--redis", redis.url,
                "--port", str(ports["sidecar"]), "--worker-id", "w0", "--fleet", FLEET,
                "--publish-interval", "0.1", "--max-body-bytes", str(MAX_BODY),
            ),
            name="sidecar", ready_url=f"{url['sidecar']}/prefixfleet/status", env=env,
        )  # fmt: skip
        gateway = spawn(
            prefixfleet_argv(
                "router", "gateway", "--redis", redis.url, "--port", str(ports["gateway"]),
                "--fleet", FLEET, "--refresh-interval", "0.1", "--max-body-bytes", str(MAX_BODY),
            ),
            name="gateway", env=env,
        )  # fmt: skip
        wait_for_http(f"{url['gateway']}/health", proc=gateway.proc)  # 200 once w0 is routable
        yield Services(
            list(spawn.children), url["sidecar"], url["gateway"], fleet_token_now(redis.url, FLEET)
        )
    finally:
        spawn.stop_all()
        redis.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(30.0)) as c:
        yield c


def body(value: object) -> bytes:
    return json.dumps(value).encode()


USER = [{"role": "user", "content": "hello"}]
WARM = {"source": "http://127.0.0.1:1", "hashes": []}

# (path, raw body, status, param, a word the message holds)
GATEWAY_CASES = [
    *[
        case
        for path in (CHAT, COMPLETIONS, GENERATE)
        for case in [
            (path, b"{", 400, None, "not valid JSON"),
            (path, b"", 400, None, "not valid JSON"),
            (path, b'{"prompt": "\xff"}', 400, None, "utf-8"),
            (path, b"[1, 2]", 400, None, "JSON object"),
            (path, b"42", 400, None, "JSON object"),
            (path, b"[" * 100_000, 400, None, "nested too deeply"),
            (path, b" " * (MAX_BODY + 1), 413, "body", str(MAX_BODY)),
        ]
    ],
    (CHAT, body({}), 400, "messages", "required"),
    (CHAT, body({"messages": "hello"}), 400, "messages", "list"),
    (CHAT, body({"messages": []}), 400, "messages", "non-empty"),
    (CHAT, body({"messages": [1]}), 400, "messages", "messages[0]"),
    (CHAT, body({"messages": [{"role": "user", "content": 5}]}), 400, "messages", "messages[0].content"),
    (CHAT, body({"messages": [{"role": 5, "content": "x"}]}), 400, "messages", "messages[0].role"),
    (CHAT, body({"messages": USER, "max_tokens": "five"}), 400, "max_tokens", "integer"),
    (CHAT, body({"messages": USER, "max_tokens": -1}), 400, "max_tokens", "negative"),
    (CHAT, body({"messages": USER, "max_tokens": 10**20}), 400, "max_tokens", "max_tokens"),  # the engine's
    (CHAT, body({"messages": USER, "stream": "maybe"}), 400, "stream", "boolean"),
    (CHAT, body({"messages": USER, "model": 5}), 400, "model", "string"),
    (CHAT, body({"messages": USER, "cache_salt": 5}), 400, "cache_salt", "string"),
    (COMPLETIONS, body({"max_tokens": 2}), 400, "prompt", "required"),
    (COMPLETIONS, body({"prompt": 5}), 400, "prompt", "string"),
    (COMPLETIONS, body({"prompt": []}), 400, "prompt", "empty"),
    (COMPLETIONS, body({"prompt": [-1]}), 400, "prompt", "token id"),
    (COMPLETIONS, body({"prompt": ["a", 1]}), 400, "prompt", "mix"),
    (COMPLETIONS, body({"prompt": "x", "max_tokens": 1.5}), 400, "max_tokens", "integer"),
    (GENERATE, body({"sampling_params": {}}), 400, "text", "exactly one"),
    (GENERATE, body({"text": "x", "input_ids": [1]}), 400, "text", "exactly one"),
    (GENERATE, body({"text": "x", "sampling_params": 5}), 400, "sampling_params", "object"),
    (GENERATE, body({"input_ids": [2**32]}), 400, "input_ids", "token id"),
    (
        GENERATE,
        body({"text": "x", "sampling_params": {"max_new_tokens": "3"}}),
        400,
        "sampling_params.max_new_tokens",
        "integer",
    ),
]

SIDECAR_CASES = [
    *[
        case
        for path in ("/prefixfleet/warm", "/prefixfleet/state")
        for case in [
            (path, b"{", 400, None, "not valid JSON"),
            (path, b"", 400, None, "not valid JSON"),
            (path, b"\xff", 400, None, "utf-8"),
            (path, b'["state"]', 400, None, "JSON object"),
            (path, b"[" * 100_000, 400, None, "nested too deeply"),
            (path, b" " * (MAX_BODY + 1), 413, "body", str(MAX_BODY)),
        ]
    ],
    ("/prefixfleet/warm", body({}), 400, "source", "source"),
    ("/prefixfleet/warm", body({**WARM, "source": 5}), 400, "source", "http://host:port"),
    ("/prefixfleet/warm", body({**WARM, "hashes": "abc"}), 400, "hashes", "list"),
    ("/prefixfleet/warm", body({**WARM, "hashes": ["zz"]}), 400, "hashes", "16 hex digits"),
    ("/prefixfleet/warm", body({**WARM, "hold_traffic": "no"}), 400, "hold_traffic", "true or false"),
    ("/prefixfleet/state", body({"state": 5}), 400, "state", "one of"),
    ("/prefixfleet/state", body({}), 400, "state", "one of"),
]


def assert_error(resp: httpx.Response, status: int, param: str | None, word: str) -> None:
    """An OpenAI-style error object as JSON, ``param`` and the message naming what is wrong."""
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:300]
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == status
    assert error["param"] == param, error
    assert word.lower() in error["message"].lower(), error["message"]


@pytest.mark.parametrize(("path", "raw", "status", "param", "word"), GATEWAY_CASES)
def test_the_gateway_refuses_a_bad_generation_request_naming_what_is_wrong(
    services: Services, client: httpx.Client, path: str, raw: bytes, status: int, param: str | None, word: str
) -> None:
    assert_error(client.post(services.gateway + path, content=raw, headers=JSON), status, param, word)


@pytest.mark.parametrize(("path", "raw", "status", "param", "word"), SIDECAR_CASES)
def test_the_sidecar_refuses_a_bad_admin_request_naming_what_is_wrong(
    services: Services, client: httpx.Client, path: str, raw: bytes, status: int, param: str | None, word: str
) -> None:
    resp = client.post(services.sidecar + path, content=raw, headers=services.control(JSON))
    assert_error(resp, status, param, word)


@pytest.mark.parametrize(
    ("path", "raw"),
    # hold_traffic false: the replica stays ready (no warming window for the gateway to route around)
    [
        ("/prefixfleet/state", body({"state": "ready"})),
        ("/prefixfleet/warm", body({**WARM, "hold_traffic": False})),
    ],
)
def test_the_sidecar_reads_admin_json_as_utf8_whatever_charset_is_named(
    services: Services, client: httpx.Client, path: str, raw: bytes
) -> None:
    headers = services.control({"Content-Type": "application/json; charset=no-such-charset"})
    resp = client.post(services.sidecar + path, content=raw, headers=headers)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["worker_id"] == "w0"


@pytest.mark.parametrize(
    ("hash_", "status", "word"),
    [
        ("zz", 400, "16 hex digits"),
        ("0" * 15, 400, "16 hex digits"),
        ("0" * 17, 400, "16 hex digits"),
        ("-1", 400, "16 hex digits"),
        ("f" * 16, 404, "not cached on w0"),
    ],
)
def test_a_prefix_lookup_with_a_bad_or_unknown_hash_names_the_hash(
    services: Services, client: httpx.Client, hash_: str, status: int, word: str
) -> None:
    resp = client.get(f"{services.sidecar}/prefixfleet/prefix/{hash_}", headers=services.control())
    assert_error(resp, status, "hash", word)


@pytest.mark.parametrize(
    ("service", "method", "path", "status", "allowed"),
    [
        ("sidecar", "GET", "/prefixfleet/state", 405, "POST"),
        ("sidecar", "GET", "/prefixfleet/warm", 405, "POST"),
        ("sidecar", "POST", "/prefixfleet/status", 405, "GET,HEAD"),
        ("sidecar", "DELETE", "/prefixfleet/prefix/" + "0" * 16, 405, "GET,HEAD"),
        ("sidecar", "GET", "/prefixfleet/nothing-here", 404, None),
        ("gateway", "GET", CHAT, 405, "POST"),
        ("gateway", "PUT", "/prefixfleet/view", 405, "GET,HEAD"),
        ("gateway", "GET", "/nothing-here", 404, None),
    ],
)
def test_a_wrong_method_or_path_is_answered_by_the_service_in_the_error_shape(
    services: Services,
    client: httpx.Client,
    service: str,
    method: str,
    path: str,
    status: int,
    allowed: str | None,
) -> None:
    resp = client.request(method, services.url(service) + path)
    assert_error(resp, status, None, path)
    if allowed is not None:
        assert resp.headers["Allow"].replace(" ", "") == allowed


IDENTITY = b'"model": "emulated-llm", "revision": "main", "adapter": "", "num_tokens": 2'  # the engine's
JUNK_PREFIXES = {  # hash -> (status, body) a faulty source sidecar answers for it
    "1" * 16: (200, b"[" * 100_000),
    "2" * 16: (200, b"<html>not json</html>"),
    "3" * 16: (200, b"{" + IDENTITY + b', "request": {"path": "/x", "body": {}}}'),
    "4" * 16: (200, b"{" + IDENTITY + b', "mirror_token_ids": [1, 2]}'),
    "5" * 16: (500, b"{}"),
}


class JunkSource(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, payload = JUNK_PREFIXES[self.path.rsplit("/", 1)[1]]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_warm_up_from_a_source_answering_junk_reports_each_prefix_failed(
    services: Services, client: httpx.Client
) -> None:
    with serve_http(JunkSource) as source:
        request = {"source": source, "hashes": list(JUNK_PREFIXES), "hold_traffic": False}
        resp = client.post(services.sidecar + "/prefixfleet/warm", json=request, headers=services.control())
    assert resp.status_code == 200, resp.text[:300]
    results = resp.json()["results"]
    assert {h: r["status"] for h, r in results.items()} == dict.fromkeys(JUNK_PREFIXES, "failed")
    assert "RecursionError" in results["1" * 16]["error"]
    assert "JSONDecodeError" in results["2" * 16]["error"]
    assert "no generation route" in results["3" * 16]["error"]
    # mirror token ids alone are never replayed: they are the sidecar's tokenizer's, not the engine's
    assert "no request holding this prefix" in results["4" * 16]["error"]
    assert "HTTP 500" in results["5" * 16]["error"]


def raw_answer(url: str, request: bytes) -> bytes:
    """What the service answers ``request`` on a fresh connection (read until it closes, or 10 s)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    data = b""
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except TimeoutError:
            pass
    return data


@pytest.mark.parametrize("service", ["gateway", "sidecar"])
@pytest.mark.parametrize(
    "line_ends",
    [(b"\n", b"\n"), (b"\r\n", b"\n"), (b"\n", b"\r\n"), (b"\r\n", b"\r\r\n")],
    ids=["lf", "lf-blank", "lf-then-crlf-blank", "cr-cr-lf-blank"],
)
def test_a_head_with_bare_lf_line_ends_is_refused_at_once(
    services: Services, service: str, line_ends: tuple[bytes, bytes]
) -> None:
    eol, blank = line_ends
    payload = b'{"prompt": "x", "max_tokens": 1}'
    head = b"POST /v1/completions HTTP/1.1%sHost: x%sContent-Length: %d%s" % (eol, eol, len(payload), eol)
    answer = raw_answer(services.url(service), head + blank + payload)
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b'"invalid_request_error"' in answer


@pytest.mark.parametrize("service", ["gateway", "sidecar"])
def test_a_valid_head_arriving_byte_by_byte_is_still_served(services: Services, service: str) -> None:
    # the incomplete head is checked as it arrives (above): a valid one must not be refused
    payload = b'{"prompt": "drip", "max_tokens": 1}'
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(payload)
    host, port = services.url(service).removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(request)):
            conn.sendall(request[i : i + 1])
            time.sleep(0.002)  # separate reads on the server side
        conn.sendall(payload)
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


COMPLETION = body({"prompt": "hello", "max_tokens": 1})
CODED_PATHS = [("gateway", COMPLETIONS), ("sidecar", COMPLETIONS), ("sidecar", "/prefixfleet/warm")]


@pytest.mark.parametrize(("service", "path"), CODED_PATHS)
@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "x-gzip", "gzip, br"])
def test_a_body_in_a_coding_not_decoded_is_a_415_naming_it(
    services: Services, client: httpx.Client, service: str, path: str, coding: str
) -> None:
    """br and zstd got aiohttp's parser error ('Please install Brotli'), any other coding was read as
    plain bytes: 415 with the Accept-Encoding a client can fall back to (RFC 9110 §15.5.16)."""
    headers = services.control({**JSON, "Content-Encoding": coding})
    resp = client.post(services.url(service) + path, content=COMPLETION, headers=headers)
    assert_error(resp, 415, "body", f"Content-Encoding {coding!r} is not supported")
    assert resp.headers["Accept-Encoding"] == "gzip, deflate"


@pytest.mark.parametrize("service", ["gateway", "sidecar"])
@pytest.mark.parametrize(
    ("coding", "encode"), [("gzip", gzip.compress), ("deflate", zlib.compress), ("identity", bytes)]
)
def test_a_gzip_or_deflate_body_is_decoded_on_every_path(
    services: Services, client: httpx.Client, service: str, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    """The lean front read a gzip body as it came (400 'not valid JSON'); aiohttp decoded it when it
    served the request (chunked): now both paths decode."""
    headers = {**JSON, "Content-Encoding": coding}
    resp = client.post(services.url(service) + COMPLETIONS, content=encode(COMPLETION), headers=headers)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("service", ["gateway", "sidecar"])
def test_a_small_gzip_body_decoding_beyond_the_body_limit_is_a_413(
    services: Services, client: httpx.Client, service: str
) -> None:
    bomb = gzip.compress(b" " * (MAX_BODY * 10))  # ~1 kB on the wire
    headers = {**JSON, "Content-Encoding": "gzip"}
    resp = client.post(services.url(service) + COMPLETIONS, content=bomb, headers=headers)
    assert_error(resp, 413, "body", str(MAX_BODY))


@pytest.mark.parametrize(("service", "path"), CODED_PATHS)
def test_a_body_that_does_not_decode_as_its_coding_is_a_400(
    services: Services, client: httpx.Client, service: str, path: str
) -> None:
    """The sidecar's admin endpoints answered aiohttp's plain-text 500."""
    headers = services.control({**JSON, "Content-Encoding": "gzip"})
    resp = client.post(services.url(service) + path, content=COMPLETION, headers=headers)
    assert_error(resp, 400, "body", "cannot be decoded as its Content-Encoding 'gzip'")


def test_every_service_survived_and_logged_no_traceback(services: Services, client: httpx.Client) -> None:
    resp = client.post(services.gateway + CHAT, json={"messages": USER, "max_tokens": 2})
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["choices"][0]["message"]["content"]
    for child in services.children:
        assert child.running(), child.name
        if child.name != "engine":  # the emulator is plain aiohttp: it logs a bad head at ERROR
            assert "Traceback" not in child.log(), f"{child.name}:\n{child.log()[-3000:]}"
