"""The gateway's HTTP surface as an OpenAI-compatible client sees it (real processes on 127.0.0.1).

Specification:
* a body the JSON parser gives up on without a JSONDecodeError — nested too deeply ("[[[[..."
  100,000 levels: RecursionError) or holding an integer of 5000 digits (ValueError: above Python's
  4300-digit limit) — is a 400 naming the JSON, in the OpenAI error shape, from the gateway, also
  with tenant isolation on (it answered 500 "internal error"); the sidecar forwards it untracked and
  passes on the engine's 400 (it answered 500, leaving the request it had already sent to the engine
  unclosed); the sidecar's ``/prefixfleet/state`` answers such a body 400 too (500 when too deep);
* a ``cache_salt`` holding a lone surrogate (``"\\ud800"`` in the JSON) is a 400 naming
  ``cache_salt`` at the gateway (hashing the salt as UTF-8 raised: 500); the sidecar forwards it
  untracked for the engine to judge;
* with tenant isolation on, a prompt holding a lone surrogate is routed like any other (re-encoding
  the body with the tenant's salt raised: 500), and a tenant header that is not UTF-8 is a 400 naming
  the header (500 "Server got itself in trouble"); so is a tenant header sent twice (the first value,
  possibly the client's own next to the proxy's, was taken as the tenant);
* an unknown path (404) and a wrong method (405, with ``Allow``) answer in the same JSON error shape
  as every other gateway error, not aiohttp's plain text;
* with no worker, ``/v1/models`` and a generation request give the same 503 error (type
  ``service_unavailable``; ``/v1/models`` said ``server_error``);
* a client that leaves before its (non-streamed) answer began aborts the request on the engine, as
  it does when talking to the engine directly: the gateway stops waiting on the sidecar, the sidecar
  on the engine (both kept waiting, and the engine generating, until the answer was complete) —
  also for a request the front hands to aiohttp (a chunked body);
* a prompt above ``--max-prompt-tokens`` is a 413 naming the field it came in (``messages``,
  ``prompt``, ``text`` or ``input_ids``; it said ``prompt`` for every endpoint);
* an OpenAI tool-calling conversation (an assistant turn with ``"content": null`` beside its
  ``tool_calls``, then the tool's answer) is routed and answered, through the gateway and sidecar to
  the emulator, streamed or not (both the gateway and the emulator refused it: 400
  ``messages[1].content``), while a user message without content is still a 400 naming it;
* ``GET /v1/models`` passes the client's headers on (an engine's API key, as for generation; it sent
  none, so an engine behind a key answered 401) and asks for an uncompressed answer (aiohttp asked
  for gzip and kept it compressed, while the gateway drops Content-Encoding: the client got gzip
  bytes labelled JSON), and names the worker that answered in ``X-Prefixfleet-Worker`` as every
  answer does (docs/gateway.md; it did not);
* a request header that is not UTF-8 (latin-1 ``café``, raw ``\\xff``: legal opaque bytes in HTTP) is
  passed on as it came, by the gateway and the sidecar (writing it upstream raised: 500);
* every answer carries one ``Date`` header, streamed or not, whichever server parsed the request
  (each lean front added its own beside the engine's: three on a generation answer);
* every one of these leaves the services serving.
"""

from __future__ import annotations

import gzip
import json
import socket
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
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(120)

FLEET = "surface"
TENANT_HEADER = "X-Tenant"
DEEP = b"[" * 100_000 + b"]" * 100_000
BIG_INT = b'{"prompt": "x", "max_tokens": ' + b"1" * 5000 + b"}"  # above int()'s 4300-digit limit
MAX_PROMPT = 1000
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}


@dataclass
class Services:
    children: list[Spawned]
    engine: str
    sidecar: str
    gateway: str
    tenant_gateway: str
    empty_gateway: str  # its fleet has no worker
    token: str  # the fleet's control token, read from its Redis as the operator does

    def all_running(self) -> bool:
        return all(c.running() for c in self.children)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    directory: Path = tmp_path_factory.mktemp("surface")
    redis = RedisServer(free_port(), directory)
    redis.start()
    spawn = Spawner(directory)
    try:
        names = ("engine", "sidecar", "gateway", "tenant_gateway", "empty_gateway")
        ports = {name: free_port() for name in names}
        url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        spawn(
            prefixfleet_argv(
                "emulator", "--port", str(ports["engine"]), "--cache-tokens", "20000", "--time-scale", "1"
            ),
            name="engine", ready_url=f"{url['engine']}/health",
        )  # fmt: skip
        spawn(
            prefixfleet_argv(
                "router", "sidecar", "--engine", url["engine"], "--redis", redis.url,
                "--port", str(ports["sidecar"]), "--worker-id", "w0", "--fleet", FLEET,
                "--publish-interval", "0.1",
            ),
            name="sidecar", ready_url=f"{url['sidecar']}/prefixfleet/status",
        )  # fmt: skip
        for name, extra in (("gateway", ()), ("tenant_gateway", ("--tenant-header", TENANT_HEADER))):
            argv = prefixfleet_argv(
                "router", "gateway", "--redis", redis.url, "--port", str(ports[name]),
                "--fleet", FLEET, "--refresh-interval", "0.1", "--max-prompt-tokens", str(MAX_PROMPT), *extra,
            )  # fmt: skip
            gateway = spawn(argv, name=name)
            wait_for_http(f"{url[name]}/health", proc=gateway.proc)  # 200 once w0 is routable
        argv = prefixfleet_argv(
            "router", "gateway", "--redis", redis.url, "--port", str(ports["empty_gateway"]),
            "--fleet", "nobody", "--refresh-interval", "0.1",
        )  # fmt: skip
        gateway = spawn(argv, name="empty_gateway")
        wait_for_http(f"{url['empty_gateway']}/livez", proc=gateway.proc)
        yield Services(
            list(spawn.children),
            url["engine"],
            url["sidecar"],
            url["gateway"],
            url["tenant_gateway"],
            url["empty_gateway"],
            fleet_token_now(redis.url, FLEET),
        )
    finally:
        spawn.stop_all()
        redis.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(30.0)) as c:
        yield c


def post(
    client: httpx.Client, url: str, body: bytes, headers: dict[str, str | bytes] | None = None
) -> httpx.Response:
    return client.post(url, content=body, headers={"Content-Type": "application/json", **(headers or {})})


def assert_openai_error(resp: httpx.Response, status: int, param: str | None, *words: str) -> None:
    """``{"error": {"message", "type", "param", "code"}}`` as JSON, its message naming ``words``."""
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == status
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error["message"]


def assert_still_serving(client: httpx.Client, services: Services) -> None:
    assert services.all_running()
    resp = post(client, f"{services.gateway}/v1/chat/completions", json.dumps(CHAT).encode())
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
@pytest.mark.parametrize(("body", "word"), [(DEEP, "nested"), (BIG_INT, "digits")], ids=["deep", "big_int"])
def test_json_the_parser_gives_up_on_is_a_400_naming_the_json(
    services: Services, client: httpx.Client, path: str, body: bytes, word: str
) -> None:
    assert_openai_error(post(client, services.gateway + path, body), 400, None, "not valid JSON", word)
    assert_openai_error(
        post(client, services.tenant_gateway + path, body, {TENANT_HEADER: "acme"}),
        400, None, "not valid JSON", word,
    )  # fmt: skip
    # the sidecar leaves it to the engine (forwarded untracked), whose 400 it passes on
    assert post(client, services.sidecar + path, body).status_code == 400
    assert_still_serving(client, services)


@pytest.mark.parametrize("body", [DEEP, BIG_INT], ids=["deep", "big_int"])
def test_the_sidecar_state_endpoint_refuses_json_the_parser_gives_up_on(
    services: Services, client: httpx.Client, body: bytes
) -> None:
    resp = post(client, f"{services.sidecar}/prefixfleet/state", body, token_header(services.token))
    assert_openai_error(resp, 400, None, "not valid JSON")
    status = client.get(f"{services.sidecar}/prefixfleet/status").json()
    assert status["state"] == "ready"


def test_a_cache_salt_with_a_lone_surrogate_is_a_400_naming_cache_salt(
    services: Services, client: httpx.Client
) -> None:
    body = json.dumps({**CHAT, "cache_salt": "\ud800"}).encode()  # ensure_ascii: the JSON says \ud800
    assert b"\\ud800" in body
    resp = post(client, f"{services.gateway}/v1/chat/completions", body)
    assert_openai_error(resp, 400, "cache_salt", "cache_salt", "surrogate")
    # the sidecar does not judge what the engine accepts: forwarded untracked, the emulator takes it
    assert post(client, f"{services.sidecar}/v1/chat/completions", body).status_code == 200
    assert_still_serving(client, services)


def test_with_tenant_isolation_a_lone_surrogate_in_the_prompt_is_routed(
    services: Services, client: httpx.Client
) -> None:
    body = json.dumps({"prompt": "half a pair \ud800 here", "max_tokens": 2}).encode()
    resp = post(client, f"{services.tenant_gateway}/v1/completions", body, {TENANT_HEADER: "acme"})
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["choices"][0]["text"]
    assert resp.headers["x-prefixfleet-worker"] == "w0"


def test_with_tenant_isolation_a_tenant_header_that_is_not_utf8_is_a_400_naming_it(
    services: Services, client: httpx.Client
) -> None:
    body = json.dumps(CHAT).encode()
    resp = post(client, f"{services.tenant_gateway}/v1/chat/completions", body, {TENANT_HEADER: b"\xff\xfe"})
    assert_openai_error(resp, 400, TENANT_HEADER, TENANT_HEADER, "UTF-8")
    ok = post(client, f"{services.tenant_gateway}/v1/chat/completions", body, {TENANT_HEADER: "acme"})
    assert ok.status_code == 200, ok.text[:300]


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("POST", "/v1/nope", 404, None),
        ("POST", "/v1/chat/completions/", 404, None),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("PUT", "/v1/completions", 405, "POST"),
        ("DELETE", "/health", 405, "GET,HEAD"),
    ],
)
def test_unknown_paths_and_wrong_methods_answer_in_the_openai_error_shape(
    services: Services, client: httpx.Client, method: str, path: str, status: int, allow: str | None
) -> None:
    resp = client.request(method, services.gateway + path, content=json.dumps(CHAT).encode())
    assert_openai_error(resp, status, None, method, path)
    assert resp.headers.get("allow") == allow
    if allow:
        assert allow.split(",")[0] in resp.json()["error"]["message"]
    assert_still_serving(client, services)


def test_with_no_worker_models_and_generation_answer_the_same_503(
    services: Services, client: httpx.Client
) -> None:
    errors = [
        client.get(f"{services.empty_gateway}/v1/models"),
        post(client, f"{services.empty_gateway}/v1/chat/completions", json.dumps(CHAT).encode()),
    ]
    for resp in errors:
        assert resp.status_code == 503, resp.text[:300]
        assert resp.headers["content-type"].startswith("application/json")
    bodies = [resp.json() for resp in errors]
    assert bodies[0] == bodies[1]
    assert bodies[0]["error"]["type"] == "service_unavailable"
    assert "no worker" in bodies[0]["error"]["message"]


def engine_aborted_requests(client: httpx.Client, engine: str) -> float:
    for line in client.get(f"{engine}/metrics").text.splitlines():
        if line.startswith("sglang:num_aborted_requests_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the emulator exports sglang:num_aborted_requests_total")


def gateway_requests(client: httpx.Client, gateway: str, endpoint: str, code: str) -> float:
    for family in text_string_to_metric_families(client.get(f"{gateway}/metrics").text):
        for sample in family.samples:
            if sample.name == "prefixfleet_gateway_requests_total" and sample.labels == {
                "endpoint": endpoint,
                "code": code,
            }:
                return sample.value
    return 0.0


def sidecar_in_flight(client: httpx.Client, sidecar: str) -> int:
    return client.get(f"{sidecar}/prefixfleet/status").json()["load"]["in_flight"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])  # chunked: aiohttp serves it
def test_a_client_that_leaves_before_its_answer_aborts_the_request_on_the_engine(
    services: Services, client: httpx.Client, framing: str
) -> None:
    aborted_before = engine_aborted_requests(client, services.engine)
    closed_before = gateway_requests(client, services.gateway, "/v1/completions", "499")
    # minutes of decoding at time scale 1: only an abort ends it while this test runs
    body = json.dumps({"prompt": "an answer nobody waits for", "max_tokens": 10_000}).encode()
    if framing == "chunked":
        framed = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        framed = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    host, port = services.gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + framed
        )
        wait_until(
            lambda: sidecar_in_flight(client, services.sidecar), 20, "the request to reach the sidecar"
        )
    wait_until(
        lambda: engine_aborted_requests(client, services.engine) - aborted_before,
        20,
        "the engine to abort the request its client left",
    )
    wait_until(
        lambda: sidecar_in_flight(client, services.sidecar),
        20,
        "the sidecar to count the request done",
        done=lambda n: n == 0,
    )
    # and the gateway still counts it, under nginx's 499 "client closed request"
    wait_until(
        lambda: gateway_requests(client, services.gateway, "/v1/completions", "499") - closed_before,
        20,
        "the gateway to count the request its client left",
    )
    assert_still_serving(client, services)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 2000}]}, "messages"),
        ("/v1/completions", {"prompt": "word " * 2000}, "prompt"),
        ("/generate", {"text": "word " * 2000}, "text"),
        ("/generate", {"input_ids": list(range(2000))}, "input_ids"),
    ],
)
def test_a_prompt_above_the_limit_is_a_413_naming_its_field(
    services: Services, client: httpx.Client, path: str, body: dict, field: str
) -> None:
    resp = post(client, services.gateway + path, json.dumps(body).encode())
    assert_openai_error(resp, 413, field, f"'{field}'", str(MAX_PROMPT))


def test_with_tenant_isolation_a_tenant_header_sent_twice_is_a_400_naming_it(
    services: Services, client: httpx.Client
) -> None:
    headers = [
        ("Content-Type", "application/json"),
        (TENANT_HEADER, "chosen-by-client"),
        (TENANT_HEADER, "acme"),
    ]
    resp = client.post(
        f"{services.tenant_gateway}/v1/chat/completions", content=json.dumps(CHAT), headers=headers
    )
    assert_openai_error(resp, 400, TENANT_HEADER, TENANT_HEADER, "once")


TOOL_TURN = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
}
TOOL_CHAT = [{"role": "user", "content": "weather in Paris?"}, TOOL_TURN]
TOOL_CHAT.append({"role": "tool", "tool_call_id": "c1", "content": "sunny"})


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_calling_conversation_with_null_assistant_content_is_answered(
    services: Services, client: httpx.Client, stream: bool
) -> None:
    for messages in (TOOL_CHAT, [*TOOL_CHAT[:1], {k: v for k, v in TOOL_TURN.items() if k != "content"}]):
        body = json.dumps({"messages": messages, "max_tokens": 2, "stream": stream}).encode()
        resp = post(client, f"{services.gateway}/v1/chat/completions", body)
        assert resp.status_code == 200, resp.text[:300]
        assert resp.headers["x-prefixfleet-worker"] == "w0"
        if stream:
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.text.rstrip().endswith("data: [DONE]")
        else:
            assert resp.json()["choices"][0]["message"]["content"]


def test_a_user_message_without_content_is_still_a_400_naming_it(
    services: Services, client: httpx.Client
) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": None}]}).encode()
    resp = post(client, f"{services.gateway}/v1/chat/completions", body)
    assert_openai_error(resp, 400, "messages", "messages[0].content")


API_KEY = "sk-test"
MODELS = {"object": "list", "data": [{"id": "keyed-llm", "object": "model", "owned_by": "someone"}]}


class KeyedEngine(BaseHTTPRequestHandler):
    """A bare engine like vLLM with --api-key behind a compressing server: /health is open, /v1/*
    needs the key, and answers are gzipped for clients that accept it."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, b"", "text/plain")
        elif self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._answer(401, json.dumps({"error": {"message": "bad API key"}}).encode(), "application/json")
        else:
            self._answer(200, json.dumps(MODELS).encode(), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
        data = gzip.compress(body) if gzipped and body else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if gzipped and body:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        return


@pytest.fixture
def keyed_engine() -> Iterator[str]:
    with serve_http(KeyedEngine) as url:
        yield url


def test_models_passes_the_clients_api_key_answers_uncompressed_and_names_its_worker(
    spawn: Spawner, keyed_engine: str, client: httpx.Client
) -> None:
    port = free_port()
    gateway = spawn(prefixfleet_argv("router", "gateway", "--port", str(port), "--worker", keyed_engine))
    wait_for_http(f"http://{LOOPBACK}:{port}/health", proc=gateway.proc)  # the engine's /health answered
    url = f"http://{LOOPBACK}:{port}/v1/models"
    resp = client.get(url, headers={"Authorization": f"Bearer {API_KEY}"})
    assert resp.status_code == 200, resp.content[:200]
    assert resp.json() == MODELS
    assert resp.headers["x-prefixfleet-worker"] == keyed_engine  # a static worker is named by its URL
    assert client.get(url).status_code == 401  # the engine judges the key, not the gateway


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])  # chunked: aiohttp serves it
def test_every_answer_carries_one_date_header(
    services: Services, client: httpx.Client, stream: bool, framing: str
) -> None:
    body = json.dumps({**CHAT, "stream": stream}).encode()
    for url in (services.gateway, services.sidecar):
        content = iter([body]) if framing == "chunked" else body  # an iterator: httpx sends it chunked
        resp = client.post(
            f"{url}/v1/chat/completions", content=content, headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 200, resp.text[:300]
        assert len(resp.headers.get_list("date")) == 1, (url, resp.headers.get_list("date"))
    refused = post(client, f"{services.gateway}/v1/chat/completions", b"{")
    assert refused.status_code == 400
    assert len(refused.headers.get_list("date")) == 1


@pytest.mark.parametrize("value", [b"caf\xe9", b"\xff\xfe"], ids=["latin1", "raw"])
def test_a_header_that_is_not_utf8_is_passed_on(
    services: Services, client: httpx.Client, value: bytes
) -> None:
    for url in (services.gateway, services.sidecar):
        resp = post(client, f"{url}/v1/chat/completions", json.dumps(CHAT).encode(), {"X-Client-Note": value})
        assert resp.status_code == 200, (url, resp.text[:300])
        assert resp.json()["choices"][0]["message"]["content"]
