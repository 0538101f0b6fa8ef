"""The data plane as real processes: Redis (Valkey), engine emulators, sidecars and two gateways.

Specification:
* responses stream through gateway and sidecar as SSE chunks ending with ``[DONE]``;
* a prefix sent through gateway A is a cache hit when its next request arrives through gateway B;
* a killed engine's in-flight non-streaming requests are retried on another worker and succeed;
* Redis holds no prompt text and no raw token ids;
* malformed requests get a 4xx naming the problem and every service stays up;
* malformed records written into Redis are ignored and the gateway keeps serving;
* a draining worker gets no new requests; static ``--worker`` gateways need no Redis.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from control_fixtures import fleet_token, token_header
from fleet_fixtures import (
    RedisServer,
    Spawned,
    Spawner,
    eventually,
    free_port,
    prefixfleet_argv,
    wait_for_http,
    wait_until,
)
from openai_usage import cached_tokens

from prefixfleet.router.blockhash import CacheIdentity, block_hashes
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.tokenizer import tokenize

FLEET = "t"
# summaries and heartbeats arrive on their own schedule (0.1 s here): poll them this long at most, a
# bound a loaded machine (xdist, five processes per fleet on 2 cores) never comes near
EVENTUALLY_S = 30.0
pytestmark = pytest.mark.timeout(120)


@dataclass
class Fleet:
    redis: RedisServer
    engines: list[Spawned] = field(default_factory=list)
    engine_urls: list[str] = field(default_factory=list)
    sidecars: list[Spawned] = field(default_factory=list)
    sidecar_urls: list[str] = field(default_factory=list)
    gateways: list[Spawned] = field(default_factory=list)
    gateway_urls: list[str] = field(default_factory=list)


def start_fleet(
    spawn: Spawner,
    redis: RedisServer,
    *,
    engines: int = 2,
    gateways: int = 2,
    engine_args: list[list[str]] | None = None,
    gateway_args: tuple[str, ...] = (),
    sidecar_args: tuple[str, ...] = ("--publish-interval", "0.1"),
) -> Fleet:
    """Start every tier in parallel, then wait for each to be ready (keeps the tests fast)."""
    fleet = Fleet(redis)
    for i in range(engines):
        port = free_port()
        extra = engine_args[i] if engine_args else ["--time-scale", "20"]
        argv = prefixfleet_argv(
            "emulator", "--port", str(port), "--cache-tokens", "20000", "--enable-cache-report", *extra
        )
        fleet.engines.append(spawn(argv, name=f"engine{i}"))
        fleet.engine_urls.append(f"http://127.0.0.1:{port}")
    for i, engine_url in enumerate(fleet.engine_urls):
        port = free_port()
        argv = prefixfleet_argv(
            "router", "sidecar", "--engine", engine_url, "--redis", redis.url, "--port", str(port),
            "--worker-id", f"w{i}", "--fleet", FLEET, *sidecar_args,
        )  # fmt: skip
        fleet.sidecars.append(spawn(argv, name=f"sidecar{i}"))
        fleet.sidecar_urls.append(f"http://127.0.0.1:{port}")
    for i in range(gateways):
        port = free_port()
        argv = prefixfleet_argv(
            "router", "gateway", "--redis", redis.url, "--port", str(port), "--fleet", FLEET,
            "--refresh-interval", "0.1", *gateway_args,
        )  # fmt: skip
        fleet.gateways.append(spawn(argv, name=f"gateway{i}"))
        fleet.gateway_urls.append(f"http://127.0.0.1:{port}")
    for child, url in zip(fleet.engines, fleet.engine_urls, strict=True):
        wait_for_http(f"{url}/health", proc=child.proc)
    for child, url in zip(fleet.sidecars, fleet.sidecar_urls, strict=True):
        wait_for_http(f"{url}/prefixfleet/status", proc=child.proc)
    for child, url in zip(fleet.gateways, fleet.gateway_urls, strict=True):
        wait_for_http(f"{url}/health", proc=child.proc)  # 200 once one worker is routable
        wait_until(
            lambda url=url: routable_workers(url),
            20,
            f"{url} to see {engines} routable workers",
            done=lambda n: n == engines,
        )
    return fleet


def routable_workers(gateway_url: str) -> int:
    """How many workers ``gateway_url`` routes to; -1 while it does not answer (a 2 s read timeout
    raised out of the wait on a loaded machine instead of meaning 'not yet')."""
    try:
        with urllib.request.urlopen(f"{gateway_url}/prefixfleet/view", timeout=10) as resp:
            return sum(w["routable"] for w in json.load(resp)["workers"])
    except OSError:
        return -1


@pytest.fixture
def fleet(spawn: Spawner, redis_server: RedisServer) -> Iterator[Fleet]:
    yield start_fleet(spawn, redis_server)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def post(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict, dict]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None), dict(resp.headers)


async def view_of(session: aiohttp.ClientSession, gateway_url: str) -> dict[str, dict]:
    async with session.get(f"{gateway_url}/prefixfleet/view") as resp:
        return {w["worker_id"]: w for w in (await resp.json())["workers"]}


async def metric(session: aiohttp.ClientSession, gateway_url: str, name: str) -> float:
    async with session.get(f"{gateway_url}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- streaming -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "stream me"}], "max_tokens": 12}),
        ("/v1/completions", {"prompt": "stream me too", "max_tokens": 12}),
        ("/generate", {"text": "and me", "sampling_params": {"max_new_tokens": 12}}),
    ],
)
async def test_responses_stream_through_gateway_and_sidecar_as_sse_chunks(fleet, http, path, body):
    events: list[bytes] = []
    async with http.post(fleet.gateway_urls[0] + path, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Prefixfleet-Worker"] in {"w0", "w1"}
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    assert len(payloads) >= 12, "one event per generated token, passed through one by one"
    assert not any("error" in p for p in payloads)
    assert await metric(http, fleet.gateway_urls[0], "prefixfleet_gateway_ttft_seconds_count") == 1


# -- one routing view across gateways --------------------------------------------------------------


async def test_a_prefix_routed_through_gateway_a_is_a_hit_through_gateway_b(fleet, http):
    gw_a, gw_b = fleet.gateway_urls
    system = words("policy", 300)
    status, first, headers = await post(
        http,
        f"{gw_a}/generate",
        {"text": f"{system} first question", "sampling_params": {"max_new_tokens": 2}},
    )
    assert status == 200 and first["meta_info"]["cached_tokens"] == 0
    holder = headers["X-Prefixfleet-Worker"]

    async def b_sees_the_prefix() -> bool:
        return (await view_of(http, gw_b))[holder]["summary_blocks"] >= 300 // 16

    await eventually(b_sees_the_prefix, EVENTUALLY_S, "gateway B to read the holder's summary")
    status, second, headers = await post(
        http,
        f"{gw_b}/generate",
        {"text": f"{system} second question", "sampling_params": {"max_new_tokens": 2}},
    )
    assert status == 200
    assert headers["X-Prefixfleet-Worker"] == holder
    assert second["meta_info"]["cached_tokens"] >= 300


async def test_a_burst_on_a_new_prefix_sticks_to_the_worker_that_took_its_first_request(
    spawn, redis_server, http
):
    """Concurrent requests on a fresh prefix share the worker that prefilled it.

    Engines at real speed and a long prefix make a miss cost far more than any queue here, so the
    load-aware default policy must keep the burst on the holder (the overlay of its own sends and
    the sidecar's summary both show it; tests/test_dataplane_summary.py pins the overlay on its own).
    """
    fleet = start_fleet(spawn, redis_server, gateways=1, engine_args=[["--time-scale", "1"]] * 2)
    system = words("burst", 2000)
    bodies = [{"prompt": f"{system} user {i}", "max_tokens": 1} for i in range(6)]
    status, _, headers = await post(http, f"{fleet.gateway_urls[0]}/v1/completions", bodies[0])
    assert status == 200
    results = await asyncio.gather(
        *(post(http, f"{fleet.gateway_urls[0]}/v1/completions", b) for b in bodies[1:])
    )
    assert {h["X-Prefixfleet-Worker"] for _, _, h in results} == {headers["X-Prefixfleet-Worker"]}


# -- failures --------------------------------------------------------------------------------------


async def test_a_killed_engines_in_flight_requests_are_retried_and_succeed(spawn, redis_server, http):
    # w0 decodes slowly (time-scale 1) so its requests are surely in flight when it dies
    fleet = start_fleet(
        spawn, redis_server, gateways=1, engine_args=[["--time-scale", "1"], ["--time-scale", "20"]],
        gateway_args=("--policy", "round_robin"),
    )  # fmt: skip
    gw = fleet.gateway_urls[0]
    bodies = [
        {"text": f"{words('kill', 40)} request {i}", "sampling_params": {"max_new_tokens": 300}}
        for i in range(6)
    ]
    tasks = [asyncio.create_task(post(http, f"{gw}/generate", b)) for b in bodies]

    async def w0_busy() -> bool:
        async with http.get(f"{fleet.sidecar_urls[0]}/prefixfleet/status") as resp:
            return (await resp.json())["load"]["in_flight"] >= 2

    await eventually(w0_busy, EVENTUALLY_S, "requests in flight on w0")
    fleet.engines[0].kill()
    results = await asyncio.gather(*tasks)
    assert [status for status, _, _ in results] == [200] * 6
    assert all(body["meta_info"]["completion_tokens"] == 300 for _, body, _ in results)
    assert await metric(http, gw, "prefixfleet_gateway_retries_total") >= 2
    # the dead worker drops out of routing; new requests go straight to the survivor
    await eventually(lambda: _not_routable(http, gw, "w0"), EVENTUALLY_S, "w0 to leave the routable set")
    status, _, headers = await post(http, f"{gw}/generate", bodies[0])
    assert status == 200 and headers["X-Prefixfleet-Worker"] == "w1"
    # the engine comes back (same port, empty cache): its sidecar forgets what the old one held
    port = fleet.engine_urls[0].rsplit(":", 1)[1]
    spawn(prefixfleet_argv("emulator", "--port", port, "--time-scale", "20"), name="engine0-again",
          ready_url=f"{fleet.engine_urls[0]}/health")  # fmt: skip
    await eventually(lambda: _routable(http, gw, "w0"), EVENTUALLY_S, "w0 to be routable again")
    async with http.get(f"{fleet.sidecar_urls[0]}/prefixfleet/status") as resp:
        assert (await resp.json())["load"]["cached_tokens"] == 0
    assert "resetting the cache mirror" in fleet.sidecars[0].log()


async def _routable(http: aiohttp.ClientSession, gw: str, worker: str) -> bool:
    return bool((await view_of(http, gw))[worker]["routable"])


async def _not_routable(http: aiohttp.ClientSession, gw: str, worker: str) -> bool:
    return not (await view_of(http, gw))[worker]["routable"]


async def test_a_stream_cut_mid_way_ends_with_an_error_event(spawn, redis_server, http):
    fleet = start_fleet(spawn, redis_server, engines=1, gateways=1, engine_args=[["--time-scale", "1"]])
    body = {"prompt": words("cut", 30), "max_tokens": 500, "stream": True}
    events: list[bytes] = []
    async with http.post(f"{fleet.gateway_urls[0]}/v1/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                if len(events) == 3:
                    fleet.engines[0].kill()
    assert b"[DONE]" not in events
    assert json.loads(events[-1])["error"]["type"] == "upstream_disconnected"


# -- privacy ---------------------------------------------------------------------------------------


async def test_redis_holds_no_prompt_text_and_no_token_ids(fleet, http):
    secret = "zebra quokka narwhal axolotl pangolin " * 20
    for gw in fleet.gateway_urls:
        for path, body in [
            ("/generate", {"text": f"{secret} one", "sampling_params": {"max_new_tokens": 2}}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": secret}], "max_tokens": 2}),
        ]:
            assert (await post(http, gw + path, body))[0] == 200

    async def summaries_published() -> bool:
        views = await view_of(http, fleet.gateway_urls[0])
        return sum(w["summary_blocks"] for w in views.values()) >= 2 * 100 // 16

    await eventually(summaries_published, EVENTUALLY_S, "summaries with the prompts' blocks")
    client = fleet.redis.client()
    values: list[bytes] = []
    for key in client.scan_iter("*"):
        kind = client.type(key)
        if kind == b"string":
            values.append(client.get(key))
        elif kind == b"hash":
            values.extend(k + b"=" + v for k, v in client.hgetall(key).items())
        values.append(key)
    blob = b"\n".join(values)
    assert values
    for word in ("zebra", "quokka", "narwhal", "axolotl", "pangolin"):
        assert word.encode() not in blob
    ids = tokenize(secret)
    for i in range(0, 20):
        window = struct.pack("<3I", *ids[i : i + 3])
        assert window not in blob, "raw token ids in Redis"
        assert re.search(rf"\b{ids[i]}\b".encode(), blob) is None


# -- bad input -------------------------------------------------------------------------------------


@pytest.fixture
def strict_fleet(spawn: Spawner, redis_server: RedisServer) -> Fleet:
    return start_fleet(
        spawn, redis_server, engines=1, gateways=1,
        gateway_args=("--max-prompt-tokens", "1000", "--max-body-bytes", "100000"),
    )  # fmt: skip


BAD_REQUESTS = [
    ("/generate", b"{not json", 400, "not valid JSON"),
    ("/generate", b'"just a string"', 400, "JSON object"),
    ("/generate", b'{"sampling_params": {}}', 400, "'text'"),
    ("/generate", b'{"text": 42}', 400, "'text'"),
    ("/generate", b'{"text": "hi", "stream": "maybe"}', 400, "'stream'"),
    ("/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": "many"}}', 400, "max_new_tokens"),
    ("/v1/completions", b'{"model": "x"}', 400, "'prompt' is required"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -3}', 400, "'max_tokens'"),
    ("/v1/completions", b'{"prompt": [1, "two"]}', 400, "prompt"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "'messages'"),
    ("/v1/chat/completions", b'{"messages": [{"role": 1, "content": "x"}]}', 400, "messages[0].role"),
    ("/v1/completions", json.dumps({"prompt": "word " * 1001}).encode(), 413, "at most 1000"),
    ("/v1/completions", json.dumps({"prompt": "x" * 200_000}).encode(), 413, "exceeds 100000 bytes"),
]


async def test_malformed_requests_get_a_4xx_naming_the_problem_and_services_stay_up(strict_fleet, http):
    gw = strict_fleet.gateway_urls[0]
    for path, raw, status, fragment in BAD_REQUESTS:
        async with http.post(gw + path, data=raw, headers={"Content-Type": "application/json"}) as resp:
            body = await resp.json(content_type=None)
            assert resp.status == status, (path, raw[:60], body)
            assert fragment in body["error"]["message"], (fragment, body)
    # the sidecar refuses an oversized body itself and forwards what the engine should judge
    sidecar = strict_fleet.sidecar_urls[0]
    async with http.post(f"{sidecar}/generate", data=b"{not json") as resp:
        assert 400 <= resp.status < 500
    status, ok, _ = await post(http, f"{gw}/generate", {"text": "still fine", "sampling_params": {}})
    assert status == 200 and ok["meta_info"]["prompt_tokens"] == 2
    assert all(
        child.running() for child in strict_fleet.engines + strict_fleet.sidecars + strict_fleet.gateways
    )
    assert await metric(http, gw, 'prefixfleet_gateway_errors_total{kind="bad_request"}') == len(BAD_REQUESTS)


async def test_malformed_records_in_redis_are_ignored_and_the_gateway_keeps_serving(fleet, http):
    keys = FleetKeys(FLEET)
    client = fleet.redis.client()
    dead_port = free_port()  # nothing listens there
    ghost = MemberRecord(url=f"http://127.0.0.1:{dead_port}", model="emulated-llm", revision="main")
    ghost_load = LoadReport(1, 0.0, "ready", True, 0, 0, 0, 1.0, 0, 0, 7)
    client.hset(
        keys.members,
        mapping={
            "ghost": encode_record(ghost),
            "junk": b"\xff{not json",
            "typed": json.dumps({"v": 1, "url": 5}),
            "badload": encode_record(ghost),
        },
    )
    client.set(keys.load("ghost"), encode_record(ghost_load))
    client.set(keys.summary("ghost"), b"PFS\x01\xff\xff\xff\x00garbage")
    client.set(keys.load("typed"), b"[]")
    client.set(keys.load("badload"), b'{"v": 1, "seq": "one"}')

    async def warned() -> bool:  # each warning names the Redis key holding the bad record
        log = fleet.gateways[0].log()
        return (
            f"ignoring summary of 'ghost' ({keys.summary('ghost')})" in log
            and f"ignoring member 'junk' of {keys.members}" in log
            and f"ignoring load of 'badload' ({keys.load('badload')})" in log
        )

    await eventually(warned, EVENTUALLY_S, "the gateway to read (and reject) the malformed records")
    for gw in fleet.gateway_urls:
        for i in range(4):
            body = {"text": f"{words('still', 20)} {i}", "sampling_params": {"max_new_tokens": 1}}
            status, _, headers = await post(http, f"{gw}/generate", body)
            assert status == 200 and headers["X-Prefixfleet-Worker"] in {"w0", "w1"}
        async with http.get(f"{gw}/health") as resp:
            assert resp.status == 200
    assert all(child.running() for child in fleet.gateways)
    assert "Traceback" not in fleet.gateways[0].log()
    # the operator's view of the same records: every problem named, exit status 1
    import subprocess

    done = subprocess.run(
        prefixfleet_argv("router", "inspect", "--redis", fleet.redis.url, "--fleet", FLEET, "--json", "-"),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    rows = {r["worker_id"]: r for r in json.loads(done.stdout)["workers"]}
    assert not rows["w0"]["problems"] and not rows["w1"]["problems"]
    assert rows["w0"]["summary_blocks"] + rows["w1"]["summary_blocks"] > 0
    assert any("bad magic" in p or "summary:" in p for p in rows["ghost"]["problems"])
    assert any(p.startswith("member:") for p in rows["junk"]["problems"])


# -- worker states and static workers ----------------------------------------------------------------


async def test_a_draining_worker_gets_no_new_requests(fleet, http):
    control = token_header(await fleet_token(fleet.redis.url, FLEET))  # as the operator sends it
    state = f"{fleet.sidecar_urls[0]}/prefixfleet/state"
    async with http.post(state, json={"state": "draining"}, headers=control) as resp:
        assert resp.status == 200 and (await resp.json())["previous"] == "ready"
    async with http.post(state, json={"state": "asleep"}, headers=control) as resp:
        assert resp.status == 400 and "state must be one of" in (await resp.json())["error"]["message"]
    for gw in fleet.gateway_urls:
        await eventually(
            lambda gw=gw: _not_routable(http, gw, "w0"), EVENTUALLY_S, "w0 draining in every gateway"
        )
    for i in range(6):
        body = {"prompt": f"{words('drain', 30)} {i}", "max_tokens": 1}
        status, _, headers = await post(http, f"{fleet.gateway_urls[i % 2]}/v1/completions", body)
        assert status == 200 and headers["X-Prefixfleet-Worker"] == "w1"
    member = json.loads(fleet.redis.client().hget(FleetKeys(FLEET).members, "w0"))
    assert member["state"] == "draining"


async def test_a_gateway_with_static_workers_needs_no_redis(spawn, http):
    ports = [free_port() for _ in range(2)]
    engines = [
        spawn(prefixfleet_argv("emulator", "--port", str(p), "--time-scale", "20", "--enable-cache-report"))
        for p in ports
    ]
    for child, p in zip(engines, ports, strict=True):
        wait_for_http(f"http://127.0.0.1:{p}/health", proc=child.proc)
    gw_port = free_port()
    argv = prefixfleet_argv(
        "router",
        "gateway",
        "--port",
        str(gw_port),
        *[a for p in ports for a in ("--worker", f"http://127.0.0.1:{p}")],
    )
    gateway = spawn(argv, name="gateway", ready_url=f"http://127.0.0.1:{gw_port}/health")
    gw = f"http://127.0.0.1:{gw_port}"
    system = words("static", 200)
    seen = set()
    for i in range(4):
        status, body, headers = await post(
            http, f"{gw}/v1/completions", {"prompt": f"{system} {i}", "max_tokens": 1}
        )
        assert status == 200
        seen.add(headers["X-Prefixfleet-Worker"])
        if i:
            assert cached_tokens(body["usage"]) >= 192
    assert len(seen) == 1, "the overlay keeps a prefix on one worker without any summary"
    async with http.get(f"{gw}/v1/models") as resp:
        assert resp.status == 200 and (await resp.json())["data"]
    assert gateway.running()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["router", "gateway", "--port", "8000"], "give --redis URL, or at least one --worker URL"),
        (["router", "gateway", "--port", "8000", "--worker", "ftp://x"], "--worker must be an http"),
        (
            ["router", "gateway", "--port", "8000", "--redis", "redis://h", "--policy", "nope"],
            "unknown --policy",
        ),
        (["router", "sidecar", "--engine", "http://e", "--port", "0"], "--port must be in 1..65535"),
        (["router", "sidecar", "--engine", "http://e", "--port", "1", "--worker-id", "a b"], "--worker-id"),
        (["router", "sidecar", "--engine", "e:1", "--port", "1"], "--engine must be an http"),
    ],
)
def test_bad_flags_are_refused_with_one_line(argv, message):
    import subprocess

    done = subprocess.run(prefixfleet_argv(*argv), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


async def test_a_redis_outage_keeps_traffic_flowing_and_the_fleet_re_registers(spawn, redis_server, http):
    fleet = start_fleet(spawn, redis_server, gateways=1)
    gw = fleet.gateway_urls[0]
    body = {"text": words("outage", 50), "sampling_params": {"max_new_tokens": 1}}
    assert (await post(http, f"{gw}/generate", body))[0] == 200
    redis_server.stop()
    for i in range(10):
        status, _, _ = await post(http, f"{gw}/generate", {**body, "text": f"{body['text']} {i}"})
        assert status == 200
        await asyncio.sleep(0.3)  # spans several refresh and publish attempts: > dead-after

    async def gateway_redis_ok() -> bool:
        async with http.get(f"{gw}/prefixfleet/view") as resp:
            return (await resp.json())["redis_ok"]

    # the gateway's failed refresh is its own schedule's business: wait for it, don't sample once
    await eventually(
        gateway_redis_ok, EVENTUALLY_S, "the gateway to notice the outage", done=lambda ok: ok is False
    )
    redis_server.start()
    client = redis_server.client()

    async def re_registered() -> bool:
        keys = FleetKeys(FLEET)
        return (
            len(client.hgetall(keys.members)) == 2
            and client.exists(keys.summary("w0"), keys.summary("w1")) == 2
        )

    await eventually(re_registered, EVENTUALLY_S, "sidecars to re-register after the restart")
    await eventually(lambda: _all_routable(http, gw), EVENTUALLY_S, "the gateway to route on fresh records")
    for child in fleet.sidecars:
        log = child.log()
        assert log.count("redis unavailable") == 1 and "publishing resumed" in log


async def _all_routable(http: aiohttp.ClientSession, gw: str) -> bool:
    async with http.get(f"{gw}/prefixfleet/view") as resp:
        view = await resp.json()
    return view["redis_ok"] and all(w["routable"] for w in view["workers"]) and len(view["workers"]) == 2


async def test_the_sidecar_mirror_tracks_the_engine_cache_through_a_streamed_conversation(
    spawn, redis_server, http
):
    fleet = start_fleet(spawn, redis_server, engines=1, gateways=1)
    messages = [{"role": "system", "content": words("persona", 100)}]
    cached: list[int] = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"question {turn} please"})
        body = {
            "messages": messages,
            "max_tokens": 10,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        answer = ""
        async with http.post(f"{fleet.gateway_urls[0]}/v1/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        cached.append(cached_tokens(event["usage"]))
                    if event["choices"]:
                        answer += event["choices"][0]["delta"].get("content") or ""
        messages.append({"role": "assistant", "content": answer})
    assert cached[0] == 0 and cached[1] > 100 and cached[2] > cached[1]  # each turn reuses the last
    async with http.get(f"{fleet.sidecar_urls[0]}/prefixfleet/status") as resp:
        mirror_tokens = (await resp.json())["load"]["cached_tokens"]
    async with http.get(f"{fleet.engine_urls[0]}/get_server_info") as resp:
        engine_tokens = (await resp.json())["internal_states"][0]["cached_tokens_in_tree"]
    assert mirror_tokens == engine_tokens  # prompt + streamed answer, exactly as the engine caches

    # the sidecar's hot prefixes (pod-local, for pre-warming another replica) name their hashes
    control = token_header(await fleet_token(fleet.redis.url, FLEET))

    async def hot_listed() -> bool:
        async with http.get(f"{fleet.sidecar_urls[0]}/prefixfleet/hot", headers=control) as resp:
            return bool((await resp.json())["prefixes"])

    await eventually(hot_listed, EVENTUALLY_S, "a summary with hot prefixes")
    async with http.get(f"{fleet.sidecar_urls[0]}/prefixfleet/hot", headers=control) as resp:
        top = (await resp.json())["prefixes"][0]
    identity = CacheIdentity("emulated-llm", "main").seed()
    assert f"{block_hashes(top['input_ids'], identity)[-1]:016x}" == top["hash"]
    assert top["num_tokens"] % 16 == 0 and top["num_tokens"] >= 96


async def test_gateways_see_load_changes_pushed_between_periodic_publishes(spawn, redis_server, http):
    """Sidecars push each load change on the loads channel; periodic publishing is 30 s apart here,
    so everything the gateway learns after start-up arrives by push."""
    fleet = start_fleet(
        spawn, redis_server, engines=1, gateways=1, engine_args=[["--time-scale", "1"]],
        sidecar_args=("--publish-interval", "30"),
    )  # fmt: skip
    body = {"prompt": words("push", 30), "max_tokens": 400, "stream": True}
    async with http.post(f"{fleet.sidecar_urls[0]}/v1/completions", json=body) as resp:  # not via the gateway
        assert resp.status == 200
        await resp.content.readline()

        async def gateway_sees_it_in_flight() -> bool:
            return (await view_of(http, fleet.gateway_urls[0]))["w0"]["in_flight"] == 1

        await eventually(gateway_sees_it_in_flight, EVENTUALLY_S, "the pushed in-flight count")

    async def gateway_sees_it_done() -> bool:
        return (await view_of(http, fleet.gateway_urls[0]))["w0"]["in_flight"] == 0

    await eventually(gateway_sees_it_done, EVENTUALLY_S, "the pushed completion")
