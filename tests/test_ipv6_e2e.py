"""The data plane on IPv6 only, end to end, as a user starts it: every process listens on ``::1``.

A Valkey server bound to ``[::1]``, two emulator engines, a sidecar in front of each and a gateway,
all started with the CLI flags users type (``--host ::1``, ``--engine http://[::1]:PORT``,
``--redis redis://[::1]:PORT/0``); nothing listens on 127.0.0.1.

Specification:
* requests sent to the gateway on ``[::1]`` are answered by an engine, and the sidecars registered
  bracketed URLs (``http://[::1]:PORT``) in the fleet's members hash;
* a second request sharing a long prefix with the first goes to the worker that holds the prefix and
  is served from its cache (``meta_info.cached_tokens`` > 0);
* a replica listening on ``::1`` only can be pre-warmed from another: it replays the fetched prefix
  through its own listening address (it used ``127.0.0.1``, where nothing listens);
* ``prefixfleet router inspect`` reads the fleet from a Redis on ``[::1]``;
* a gateway without Redis, given the sidecars as static ``--worker http://[::1]:PORT`` URLs, serves.

Skipped only when this host has no IPv6 loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from fleet_fixtures import Spawner, prefixfleet_argv, redis_server_binary

from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS, CacheIdentity, block_hashes
from prefixfleet.router.control import control_headers, fleet_control_token
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_member
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(120)
FLEET = "six"
V6 = "::1"
PREFIX = "System: you are the routing assistant of the IPv6-only cluster test. Rules follow. " * 30


def ipv6_loopback_port() -> int | None:
    """A free port on ``[::1]``; None when this host has no IPv6 loopback."""
    if not socket.has_ipv6:
        return None
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind((V6, 0))
            return s.getsockname()[1]
    except OSError:
        return None


def free_port6() -> int:
    port = ipv6_loopback_port()
    assert port is not None
    return port


def url6(port: int) -> str:
    return f"http://[{V6}]:{port}"


def wait_for(check: Callable[[], bool], timeout_s: float, *, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def listening_on_ipv4_loopback(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Fleet:
    gateway: str
    gateway_port: int
    sidecars: dict[str, str]  # worker id -> sidecar URL
    ports: list[int]
    redis_url: str


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if ipv6_loopback_port() is None:
        pytest.skip("this host has no IPv6 loopback (::1): nothing to listen on")
    directory = tmp_path_factory.mktemp("ipv6")
    redis_port = free_port6()
    log = (directory / "valkey.log").open("ab")
    valkey = subprocess.Popen(
        [redis_server_binary(), "--port", str(redis_port), "--bind", V6, "--save", "", "--appendonly", "no",
         "--dir", str(directory)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    log.close()
    spawn = Spawner(directory)
    try:
        redis_url = f"redis://[{V6}]:{redis_port}/0"
        wait_for(lambda: _pings(redis_url), 30, what="Valkey on [::1]")
        sidecars: dict[str, str] = {}
        ports = [redis_port]
        for i in range(2):
            engine_port, sidecar_port = free_port6(), free_port6()
            spawn(
                prefixfleet_argv("emulator", "--host", V6, "--port", str(engine_port), "--time-scale", "50",
                                 "--cache-tokens", "20000"),
                name=f"engine{i}", ready_url=f"{url6(engine_port)}/health",
            )  # fmt: skip
            spawn(
                prefixfleet_argv("router", "sidecar", "--host", V6, "--port", str(sidecar_port),
                                 "--engine", url6(engine_port), "--redis", redis_url, "--worker-id", f"w{i}",
                                 "--fleet", FLEET, "--publish-interval", "0.1"),
                name=f"sidecar{i}", ready_url=f"{url6(sidecar_port)}/prefixfleet/status",
            )  # fmt: skip
            sidecars[f"w{i}"] = url6(sidecar_port)
            ports += [engine_port, sidecar_port]
        gateway_port = free_port6()
        spawn(
            prefixfleet_argv("router", "gateway", "--host", V6, "--port", str(gateway_port),
                             "--redis", redis_url, "--fleet", FLEET, "--refresh-interval", "0.1"),
            name="gateway", ready_url=f"{url6(gateway_port)}/health",  # 200 once a worker routes
        )  # fmt: skip
        ports.append(gateway_port)
        # /health is 200 once one worker routes; every test here assumes both do (the first test's
        # own wait on membership made the others depend on running after it)
        wait_for(lambda: routable(url6(gateway_port)) == 2, 30, what="the gateway to route to both workers")
        yield Fleet(url6(gateway_port), gateway_port, sidecars, ports, redis_url)
    finally:
        spawn.stop_all()
        valkey.terminate()
        try:
            valkey.wait(timeout=5)
        except subprocess.TimeoutExpired:
            valkey.kill()
            valkey.wait(timeout=5)


def routable(gateway: str) -> int:
    """How many workers the gateway routes to (-1 while it does not answer)."""
    try:
        view = httpx.get(f"{gateway}/prefixfleet/view", timeout=10).json()
    except httpx.HTTPError:
        return -1
    return sum(w["routable"] for w in view["workers"])


def _pings(redis_url: str) -> bool:
    with contextlib.suppress(redis.RedisError, OSError), redis.Redis.from_url(redis_url) as client:
        return bool(client.ping())
    return False


def members(redis_url: str) -> dict[str, str]:
    with redis.Redis.from_url(redis_url) as client:
        raw = client.hgetall(FleetKeys(FLEET).members)
    return {k.decode(): decode_member(v).url for k, v in raw.items()}


def generate(url: str, text: str) -> tuple[str, int]:
    """(the worker that answered, the prompt tokens it served from cache)."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
    resp = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.headers.get("X-Prefixfleet-Worker", ""), resp.json()["meta_info"]["cached_tokens"]


def test_every_process_listens_on_ipv6_only_and_registers_bracketed_urls(fleet: Fleet) -> None:
    assert not any(listening_on_ipv4_loopback(p) for p in fleet.ports)
    wait_for(lambda: len(members(fleet.redis_url)) == 2, 30, what="both sidecars registered")
    assert members(fleet.redis_url) == fleet.sidecars


def test_a_repeated_prefix_is_routed_to_its_holder_and_served_from_cache(fleet: Fleet) -> None:
    holder, cached = generate(fleet.gateway, PREFIX + "first question?")
    assert holder in fleet.sidecars and cached == 0
    resp = httpx.post(
        f"{fleet.gateway}/v1/completions", json={"prompt": "hello over six", "max_tokens": 2}, timeout=30
    )
    assert resp.status_code == 200, resp.text
    again, cached = generate(fleet.gateway, PREFIX + "second question, same prefix?")
    assert again == holder
    assert cached >= len(tokenize(PREFIX)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS


def control_token(redis_url: str) -> str:
    """The fleet's control token, from its Redis (``redis-cli GET pf:six:control``; created by the
    first member that needs it, as the operator would)."""

    async def read() -> str:
        async with aioredis.from_url(redis_url) as client:
            return await fleet_control_token(client, FleetKeys(FLEET))

    return asyncio.run(read())


def test_a_replica_listening_on_ipv6_only_is_warmed_from_another(fleet: Fleet) -> None:
    warm_prefix = "System: warm-up prefix for the IPv6 replica, policies follow. " * 30
    source, target = fleet.sidecars["w0"], fleet.sidecars["w1"]
    generate(source, warm_prefix + "seed?")
    status = httpx.get(f"{source}/prefixfleet/status", timeout=10).json()
    seed = CacheIdentity(status["model"], status["revision"], "").seed()
    sid = f"{block_hashes(tokenize(warm_prefix), seed, DEFAULT_BLOCK_TOKENS)[-1]:016x}"
    resp = httpx.post(
        f"{target}/prefixfleet/warm",
        json={"source": source, "hashes": [sid], "hold_traffic": False},
        headers=control_headers(control_token(fleet.redis_url)),  # a control route: the fleet's token
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["results"][sid]["status"] == "ok", resp.text
    _, cached = generate(target, warm_prefix + "probe on the warmed replica?")
    assert cached >= len(tokenize(warm_prefix)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS


def test_inspect_reads_a_fleet_from_redis_on_ipv6(fleet: Fleet) -> None:
    out = subprocess.run(
        [*prefixfleet_argv("router", "inspect", "--redis", fleet.redis_url, "--fleet", FLEET)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "fleet six: 2 member(s)" in out.stdout
    for worker in fleet.sidecars:
        assert f"\n{worker} " in out.stdout


def test_a_gateway_with_static_ipv6_workers_serves(fleet: Fleet, tmp_path: Path) -> None:
    spawn = Spawner(tmp_path)
    port = free_port6()
    workers = [a for url in fleet.sidecars.values() for a in ("--worker", url)]
    try:
        spawn(
            prefixfleet_argv("router", "gateway", "--host", V6, "--port", str(port), *workers),
            name="static-gateway", ready_url=f"{url6(port)}/health",
        )  # fmt: skip
        worker, _ = generate(url6(port), PREFIX + "a static question?")
        assert worker in fleet.sidecars.values()  # a static worker's id is its URL
    finally:
        spawn.stop_all()
