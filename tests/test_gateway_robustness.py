"""The gateway and sidecar facing clients that misbehave or give up (real processes on 127.0.0.1).

Specification:
* every 503 the gateway answers itself — no worker in the fleet, every worker draining, every worker
  failing, ``/v1/models`` with no worker, ``/health`` with nothing routable — carries
  ``Retry-After: 2`` (a failed worker sits out 2 s; there was none) and the same OpenAI error body;
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fleet_fixtures import (
    LOOPBACK,
    RedisServer,
    Spawned,
    Spawner,
    free_port,
    prefixfleet_argv,
    wait_for_http,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

FLEET = "robust"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
RETRY_AFTER = "2"


@dataclass
class Fleet:
    children: list[Spawned]
    engine: str
    sidecar: str
    gateway: str
    empty_gateway: str  # its fleet has no worker
    dead_gateway: str  # its only (static) worker refuses connections

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
        ports = {name: free_port() for name in ("engine", "sidecar", "gateway", "empty", "dead", "closed")}
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
        gateway = spawn(
            prefixfleet_argv(
                "router", "gateway", "--redis", redis.url, "--port", str(ports["gateway"]),
                "--fleet", FLEET, "--refresh-interval", "0.1",
            ),
            name="gateway",
        )  # fmt: skip
        wait_for_http(f"{url(ports['gateway'])}/health", proc=gateway.proc)  # 200 once w0 is routable
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
            url(ports["empty"]),
            url(ports["dead"]),
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


def set_state(client: httpx.Client, sidecar: str, state: str) -> None:
    resp = client.post(f"{sidecar}/prefixfleet/state", json={"state": state})
    assert resp.status_code == 200, resp.text


def test_every_503_of_the_gateway_says_when_to_retry(fleet: Fleet, client: httpx.Client) -> None:
    assert_unavailable(chat(client, fleet.empty_gateway), "no worker")
    assert_unavailable(client.get(f"{fleet.empty_gateway}/v1/models"), "no worker")
    health = client.get(f"{fleet.empty_gateway}/health")
    assert (health.status_code, health.headers.get("retry-after")) == (503, RETRY_AFTER)
    # every worker failing: the retries run out
    assert_unavailable(chat(client, fleet.dead_gateway))
    # every worker draining
    set_state(client, fleet.sidecar, "draining")
    try:
        wait_until(
            lambda: chat(client, fleet.gateway).status_code, 20, "the gateway to see w0 draining",
            done=lambda status: status == 503,
        )  # fmt: skip
        assert_unavailable(chat(client, fleet.gateway), "no worker")
    finally:
        set_state(client, fleet.sidecar, "ready")
    ok = wait_until(
        lambda: chat(client, fleet.gateway), 20, "the gateway to route to w0 again",
        done=lambda resp: resp.status_code == 200,
    )  # fmt: skip
    assert "retry-after" not in ok.headers
