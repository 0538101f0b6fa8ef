"""Sidecar-to-sidecar pre-warming with real processes: Valkey, two engine emulators, two sidecars.

Specification:
* ``GET /prefixfleet/prefix/{hash}`` on the holder returns the mirror token ids of the cached prefix
  whose chained block hash is ``hash`` and the request that cached it (route and body as the client
  sent it); an unknown hash is a 404, a malformed one a 400;
* ``POST /prefixfleet/warm`` on a cold replica fetches each prefix from the source and replays its
  request, prefill only, through its own sidecar: afterwards a request with that prefix on the cold
  replica is a cache hit;
* by default (a new replica) the warmed replica is ``warming`` (announced on the events channel and in
  its Redis load record) while it warms, ``ready`` after; with ``hold_traffic: false`` (an existing
  replica, which keeps serving while it warms) it stays ``ready`` throughout: no state change at all;
* an unknown hash is reported failed in the summary, not a crash; a bad body is a 400 naming the field;
* token ids and kept requests never reach Redis (only hashes do);
* the autoscalers' client (``warm_replica``) sends one warm request per holder and tallies them: the
  good holder's prefix is warmed (its tokens counted), a request the target refuses or cannot take
  counts its prefixes failed and names its source and why in ``errors``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import httpx
import pytest
import redis
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.operator.autoscale import SubtreeObservation
from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS, CacheIdentity, block_hashes
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.prewarm import warm_replica
from prefixfleet.router.records import decode_load
from prefixfleet.tokenizer import tokenize

FLEET = "warm"
pytestmark = pytest.mark.timeout(120)
PREFIX = "System: you are the billing assistant of the warm-up test tenant. Policies follow. " * 30


@dataclass
class Pair:
    holder: str
    cold: str
    redis_url: str
    token: str  # the fleet's control token, read from its Redis as the operator does

    @property
    def control(self) -> dict[str, str]:
        return token_header(self.token)


@pytest.fixture
def pair(spawn: Spawner, redis_server: RedisServer) -> Iterator[Pair]:
    urls = []
    for i in range(2):
        engine_port, sidecar_port = free_port(), free_port()
        engine = spawn(
            prefixfleet_argv("emulator", "--port", str(engine_port), "--time-scale", "50",
                             "--cache-tokens", "20000"), name=f"engine{i}")  # fmt: skip
        sidecar = spawn(
            prefixfleet_argv("router", "sidecar", "--engine", f"http://127.0.0.1:{engine_port}",
                             "--redis", redis_server.url, "--port", str(sidecar_port), "--worker-id", f"w{i}",
                             "--fleet", FLEET, "--publish-interval", "0.1"), name=f"sidecar{i}")  # fmt: skip
        wait_for_http(f"http://127.0.0.1:{engine_port}/health", proc=engine.proc)
        wait_for_http(f"http://127.0.0.1:{sidecar_port}/prefixfleet/status", proc=sidecar.proc)
        urls.append(f"http://127.0.0.1:{sidecar_port}")
    yield Pair(urls[0], urls[1], redis_server.url, fleet_token_now(redis_server.url, FLEET))


async def generate(http: aiohttp.ClientSession, url: str, text: str) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
    async with http.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def prefix_hash(http: aiohttp.ClientSession, url: str) -> str:
    """The hash the summaries publish for PREFIX's last full block (computed independently)."""
    async with http.get(f"{url}/prefixfleet/status") as resp:
        status = await resp.json()
    seed = CacheIdentity(status["model"], status["revision"], "").seed()
    return f"{block_hashes(tokenize(PREFIX), seed, DEFAULT_BLOCK_TOKENS)[-1]:016x}"


def load_state(redis_url: str, worker: str) -> str | None:
    with redis.Redis.from_url(redis_url) as client:
        raw = client.get(FleetKeys(FLEET).load(worker))
    return decode_load(raw).state if raw is not None else None


async def subscribed_events(redis_url: str) -> redis.client.PubSub:
    """A subscription to the fleet's events channel, confirmed by Redis (SUBSCRIBE is only sent on
    the first read: a state notice published before the confirmation would be missed)."""
    events = redis.Redis.from_url(redis_url).pubsub()
    events.subscribe(FleetKeys(FLEET).events)
    for _ in range(50):
        confirmed = await asyncio.to_thread(events.get_message, timeout=0.1)
        if confirmed and confirmed["type"] == "subscribe":
            return events
    raise AssertionError("Redis never confirmed the events subscription")


async def state_notices(events: redis.client.PubSub, worker: str, reads: int) -> list[str]:
    """The ``state <worker> ...`` notices among the next ``reads`` reads (0.1 s each at most),
    stopping at ``ready``."""
    states: list[str] = []
    notice = f"state {worker} ".encode()
    for _ in range(reads):
        message = await asyncio.to_thread(events.get_message, timeout=0.1)
        if message and message["type"] == "message" and message["data"].startswith(notice):
            states.append(message["data"].decode().split()[-1])
        if states[-1:] == ["ready"]:
            break
    return states


async def test_warm_copies_a_prefix_from_the_holder_and_the_cold_replica_then_hits(pair: Pair) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await generate(http, pair.holder, PREFIX + "first question?")
        sid = await prefix_hash(http, pair.holder)
        prefix_tokens = len(tokenize(PREFIX)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS

        async with http.get(f"{pair.holder}/prefixfleet/prefix/{sid}", headers=pair.control) as resp:
            assert resp.status == 200, await resp.text()
            held = await resp.json()
        assert held["hash"] == sid and held["num_tokens"] == prefix_tokens
        assert held["mirror_token_ids"] == list(tokenize(PREFIX))[:prefix_tokens]
        sent = {"text": PREFIX + "first question?", "sampling_params": {"max_new_tokens": 2}}
        assert held["request"]["path"] == "/generate" and held["request"]["body"] == sent

        # not warmed yet: the cold replica recomputes the whole prompt
        cold_first = await generate(http, pair.cold, PREFIX + "cold probe?")
        assert cold_first["meta_info"]["cached_tokens"] == 0
        async with http.post(f"{pair.cold}/flush_cache", headers=pair.control) as resp:
            assert resp.status == 200

        # watch the cold replica's published state changes while it warms (no hold_traffic field:
        # the default, a new replica held out of rotation until warm)
        events = await subscribed_events(pair.redis_url)
        unknown = "00000000deadbeef"
        async with http.post(f"{pair.cold}/prefixfleet/warm", headers=pair.control,
                             json={"source": pair.holder, "hashes": [sid, unknown]}) as resp:  # fmt: skip
            assert resp.status == 200, await resp.text()
            summary = await resp.json()
        states = await state_notices(events, "w1", 100)
        events.close()

        assert summary["results"][sid] == {"status": "ok", "tokens": prefix_tokens, "cached_before": 0}
        assert summary["results"][unknown]["status"] == "failed"
        assert "does not hold" in summary["results"][unknown]["error"]
        assert summary["warmed_tokens"] == prefix_tokens and summary["state"] == "ready"
        changes = [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
        assert changes == ["warming", "ready"]  # warming announced before the prefills, ready after
        assert load_state(pair.redis_url, "w1") == "ready"

        # the first real request on the warmed replica is a cache hit on the whole prefix
        hit = await generate(http, pair.cold, PREFIX + "a brand new question?")
        assert hit["meta_info"]["cached_tokens"] >= prefix_tokens

    with redis.Redis.from_url(pair.redis_url) as client:
        ids = json.dumps(held["mirror_token_ids"][:8])[1:-1].encode()
        for key in client.keys("*"):
            value = client.get(key) if client.type(key) == b"string" else b""
            assert ids not in (value or b""), f"token ids leaked into Redis key {key!r}"
            assert b"billing assistant" not in (value or b""), f"a prompt leaked into Redis key {key!r}"


async def test_bad_requests_get_a_clear_4xx_and_the_sidecar_stays_up(pair: Pair) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(f"{pair.holder}/prefixfleet/prefix/not-a-hash", headers=pair.control) as resp:
            assert resp.status == 400 and "16 hex digits" in await resp.text()
        async with http.get(
            f"{pair.holder}/prefixfleet/prefix/0123456789abcdef", headers=pair.control
        ) as resp:
            assert resp.status == 404 and "not cached" in await resp.text()
        for body, field in [
            ({"hashes": []}, "source"),
            ({"source": "ftp://x", "hashes": []}, "source"),
            ({"source": pair.holder, "hashes": "abc"}, "hashes"),
            ({"source": pair.holder, "hashes": ["xyz"]}, "16 hex digits"),
            ({"source": pair.holder, "hashes": [], "hold_traffic": "no"}, "hold_traffic"),
        ]:
            async with http.post(f"{pair.cold}/prefixfleet/warm", json=body, headers=pair.control) as resp:
                assert resp.status == 400 and field in await resp.text()
        # an unreachable source: every hash reported failed, state back to ready
        dead = f"http://127.0.0.1:{free_port()}"
        async with http.post(f"{pair.cold}/prefixfleet/warm", headers=pair.control,
                             json={"source": dead, "hashes": ["0123456789abcdef"]}) as resp:  # fmt: skip
            assert resp.status == 200
            summary = await resp.json()
        assert summary["results"]["0123456789abcdef"]["status"] == "failed"
        assert summary["warmed_tokens"] == 0 and summary["state"] == "ready"
        async with http.get(f"{pair.cold}/prefixfleet/status") as resp:
            assert (await resp.json())["state"] == "ready"


async def test_warm_replica_counts_each_source_and_names_the_failed_one(pair: Pair) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await generate(session, pair.holder, PREFIX + "first question?")
        sid = await prefix_hash(session, pair.holder)
    prefix_tokens = len(tokenize(PREFIX)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS
    other = "0000000000c0ffee"
    subtrees = [
        SubtreeObservation(sid, tokens=prefix_tokens, rate_rps=1.0, holders=frozenset({"w0", "w1"})),
        SubtreeObservation(other, tokens=64, rate_rps=1.0, holders=frozenset({"odd"})),
    ]
    # "odd" advertises a URL that is no sidecar base URL: the target refuses that warm request (400)
    urls = {"w0": pair.holder, "w1": pair.cold, "odd": "http://127.0.0.1:1/not-a-base-url"}
    async with httpx.AsyncClient(timeout=30.0) as http:
        outcome = await warm_replica(
            http, pair.cold, [sid, other], subtrees, urls, exclude="w1", hold_traffic=True,
            timeout_s=lambda: 30.0, control_token=pair.token,
        )  # fmt: skip
        assert (outcome.warmed_tokens, outcome.ok, outcome.failed) == (prefix_tokens, 1, 1)
        assert [source for source, _ in outcome.errors] == [urls["odd"]]
        assert "HTTP 400" in outcome.errors[0][1] and "source" in outcome.errors[0][1]

        # a target that does not answer at all: every prefix failed, each source named once
        dead = f"http://127.0.0.1:{free_port()}"
        outcome = await warm_replica(
            http, dead, [sid, other], subtrees, urls, exclude="new-0", hold_traffic=True,
            timeout_s=lambda: 5.0, control_token=pair.token,
        )  # fmt: skip
        assert (outcome.warmed_tokens, outcome.ok, outcome.failed) == (0, 0, 2)
        assert sorted(source for source, _ in outcome.errors) == sorted([pair.holder, urls["odd"]])
        assert all(error.startswith("ConnectError") for _, error in outcome.errors), outcome.errors


async def test_a_warm_without_holding_traffic_leaves_the_replica_ready_throughout(pair: Pair) -> None:
    # an existing replica pre-warmed for a starved subtree keeps serving while it warms (as the
    # simulator models it): only a new replica is held out of rotation until warm
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await generate(session, pair.holder, PREFIX + "first question?")
        sid = await prefix_hash(session, pair.holder)
    prefix_tokens = len(tokenize(PREFIX)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS
    subtrees = [SubtreeObservation(sid, tokens=prefix_tokens, rate_rps=1.0, holders=frozenset({"w0"}))]
    events = await subscribed_events(pair.redis_url)
    seen: list[str] = []
    async with httpx.AsyncClient(timeout=30.0) as http:
        warm = asyncio.create_task(
            warm_replica(http, pair.cold, [sid], subtrees, {"w0": pair.holder}, exclude="w1",
                         hold_traffic=False, timeout_s=lambda: 30.0, control_token=pair.token)
        )  # fmt: skip
        while not warm.done():  # the sidecar's own state, polled while the warm-up runs
            seen.append((await http.get(f"{pair.cold}/prefixfleet/status")).json()["state"])
        outcome = await warm
        seen.append((await http.get(f"{pair.cold}/prefixfleet/status")).json()["state"])
    notices = await state_notices(events, "w1", 20)
    events.close()
    assert (outcome.warmed_tokens, outcome.ok, outcome.failed) == (prefix_tokens, 1, 0)
    assert set(seen) == {"ready"}, seen
    assert notices == []  # no "state w1 warming" (nor "ready") announced to the gateways
    assert load_state(pair.redis_url, "w1") == "ready"
