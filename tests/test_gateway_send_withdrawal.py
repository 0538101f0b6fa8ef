"""A send that ends before the engine's first token is withdrawn from every gateway's view.

Specification:
* a send withdrawal (``PFW1``) names the gateway, the worker, the withdrawn send's time and the
  blocks it takes back; it round-trips through its wire format, malformed ones are refused with a
  reason, and a gateway that predates it (reading the sends channel with ``decode_send``) refuses it
  as a bad-magic notice (a ``ValueError``, which it logs as one rate-limited warning) — never
  counts it as a send;
* in a view, withdrawing a send (own, or a peer's by its send time) stops matching its blocks; the
  prefix already matched before that send stays, and a later send of the same prefix is unaffected;
* end to end (a real Redis-compatible server, two real gateways routing to two real sidecars in
  front of stand-in engines, all in this process): a request that ends before its first token on
  gateway A — its client left, the engine answered with an error (or a stream whose first event is
  one), or the engine died and A retried
  elsewhere — is no longer matched by gateway B on that worker (before, B's overlay kept it until
  the overlay TTL or a summary generated over a second after the send), while a later successful
  send of the same prompt is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from fleet_fixtures import RedisServer, free_port, serve_aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.gateway import GatewayConfig, Listening, listening
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import (
    LoadReport,
    MemberRecord,
    SendNotice,
    SendWithdrawal,
    SummaryError,
    decode_send,
    decode_sends_message,
    decode_withdraw,
    encode_record,
    encode_send,
    encode_withdraw,
)
from prefixfleet.router.requests import parse_inference_request
from prefixfleet.router.sidecar import SidecarConfig
from prefixfleet.router.sidecar import listening as sidecar_listening
from prefixfleet.router.view import FleetView

B = 16
SEED = CacheIdentity("m", "r").seed()


# -- wire format -----------------------------------------------------------------------------------


def test_a_withdrawal_round_trips_and_is_told_apart_from_a_send_notice() -> None:
    sent_at = time.time()  # any float: a withdrawal must carry the send's time back exactly
    raw = encode_withdraw("gw-a", "replica-0", sent_at, [7, 2**64 - 1])
    assert raw.startswith(b"PFW1")
    withdrawal = decode_withdraw(raw)
    assert (withdrawal.gateway, withdrawal.worker, withdrawal.sent_at, list(withdrawal.hashes)) == (
        "gw-a",
        "replica-0",
        sent_at,
        [7, 2**64 - 1],
    )
    assert decode_sends_message(raw) == withdrawal
    assert isinstance(decode_sends_message(raw), SendWithdrawal)
    assert isinstance(decode_sends_message(encode_send("gw-a", "replica-0", sent_at, [7])), SendNotice)
    assert decode_sends_message(raw.decode("latin-1").encode("latin-1")) == withdrawal


def test_malformed_withdrawals_are_refused_naming_what_is_wrong() -> None:
    raw = encode_withdraw("gw-a", "replica-0", 1234.5, [1, 2])
    for bad, reason in [
        (raw[:-3], "multiple of 8"),
        (raw.replace(b"1234.5", b"nan"), "finite"),
        (raw.replace(b"1234.5", b"-1.0"), "non-negative"),
        (raw.replace(b"1234.5", b"soon"), "unreadable"),
        (raw.replace(b"replica-0", b"bad id!"), "bad gateway or worker"),
        (b"PFW1only-one-line", "header"),
    ]:
        with pytest.raises(SummaryError, match=reason):
            decode_withdraw(bad)
        with pytest.raises(SummaryError, match=reason):
            decode_sends_message(bad)
    with pytest.raises(SummaryError, match="bad magic"):
        decode_withdraw(encode_send("gw-a", "replica-0", 1.0, [1]))
    with pytest.raises(SummaryError, match="unknown message kind"):
        decode_sends_message(b"PFZ9gw-a\nw\n1.0\n")
    with pytest.raises(SummaryError, match="bytes or str"):
        decode_sends_message(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gateway id"):
        encode_withdraw("has\nnewline", "replica-0", 1.0, [])
    with pytest.raises(ValueError, match="worker id"):
        encode_withdraw("gw-a", "w1\n", 1.0, [])
    with pytest.raises(ValueError, match="send time"):
        encode_withdraw("gw-a", "w1", float("inf"), [])


@settings(max_examples=300)
@given(data=st.data())
def test_a_sends_message_with_flipped_or_missing_bytes_decodes_or_is_refused(data: st.DataObject) -> None:
    encode = data.draw(st.sampled_from([encode_send, encode_withdraw]))
    raw = bytearray(encode("gw-a", "replica-0", 1234.5, [1, 2**64 - 1, 3]))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = bytes(raw[: data.draw(st.integers(0, len(raw)))])
    for decode in (decode_sends_message, decode_send, decode_withdraw):
        try:
            message = decode(cut)
        except SummaryError:
            continue
        assert isinstance(message, SendNotice | SendWithdrawal) and 8 * len(message.hashes) < len(cut)


def test_a_gateway_that_predates_withdrawals_refuses_one_as_a_malformed_notice() -> None:
    # Such a gateway decodes every sends-channel message with decode_send and skips (with one
    # rate-limited warning) any that raises ValueError: it must not count a withdrawal as a send.
    with pytest.raises(ValueError, match="bad magic"):
        decode_send(encode_withdraw("gw-a", "replica-0", 1.0, [1, 2, 3]))


# -- the view --------------------------------------------------------------------------------------


def _view() -> FleetView:
    view = FleetView(block_tokens=B, default_identity=CacheIdentity("m", "r"))
    member = encode_record(MemberRecord(url="http://127.0.0.1:9", model="m", revision="r", block_tokens=B))
    load = encode_record(LoadReport(1, 0.0, "ready", True, 0, 0, 0, 1000.0, 0, 100, 0))
    view.apply_snapshot({"w1": member}, {"w1": load}, now=0.0)
    return view


def _chain(view: FleetView, tokens: int) -> list[int]:
    return view.request_hashes(as_token_bytes(list(range(tokens))), None, [view.workers["w1"]])[(SEED, B)]


def test_an_own_send_withdrawn_is_no_longer_matched_and_a_later_send_is_unaffected() -> None:
    view = _view()
    w1 = view.workers["w1"]
    chain = _chain(view, 64)
    handle = view.record_send("w1", chain, 64, 1000.0)
    assert view.matched_tokens(w1, chain, B, 1000.1) == 64
    view.release_send("w1", chain, 1000.0)  # it ended before the first token
    view.record_done("w1", handle, 1000.2)
    assert view.matched_tokens(w1, chain, B, 1000.3) == 0

    view.record_send("w1", chain, 64, 1001.0)  # the same prompt again, answered this time
    view.release_send("w1", chain, 1000.0)  # a late duplicate of the first withdrawal
    assert view.matched_tokens(w1, chain, B, 1001.1) == 64


def test_a_peers_withdrawal_takes_back_only_what_that_send_stamped() -> None:
    view = _view()
    w1 = view.workers["w1"]
    prefix, longer = _chain(view, 32), _chain(view, 80)
    assert longer[:2] == prefix
    view.record_peer_send("w1", prefix, sent_at=1000.0)  # answered: cached
    view.record_peer_send("w1", longer, sent_at=1000.5)  # the same start, then 3 new blocks
    assert view.matched_tokens(w1, longer, B, 1000.6) == 80
    # the peer matched the first 2 blocks already, so it withdraws the other 3
    view.release_send("w1", longer[2:], 1000.5)
    assert view.matched_tokens(w1, longer, B, 1000.7) == 32
    # a withdrawal naming another send time (another send, or a withdrawal for another one) is a no-op
    view.record_peer_send("w1", longer, sent_at=1001.0)
    view.release_send("w1", longer[2:], 1000.5)
    assert view.matched_tokens(w1, longer, B, 1001.1) == 80
    view.release_send("nobody", longer, 1001.0)  # a worker we do not know: ignored
    assert view.matched_tokens(w1, longer, B, 1001.2) == 80


# -- end to end ------------------------------------------------------------------------------------


class ScriptedEngine:
    """Stand-in engines sharing one script: each request takes its next action (default ``ok``):
    ``hold`` (never answer: the client gives up first), ``error`` (HTTP 500), ``error_stream`` (a
    200 stream whose first event is an error) or ``die`` (the connection is cut before any answer:
    the sidecar's retryable 502 sends the gateway elsewhere)."""

    def __init__(self) -> None:
        self.script: deque[str] = deque()
        self.held = asyncio.Event()
        self.served: list[tuple[str, str]] = []  # (engine url, action)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        action = self.script.popleft() if self.script else "ok"
        self.served.append((f"http://{request.host}", action))
        if action == "hold":
            self.held.set()
            await asyncio.Event().wait()  # until the sidecar aborts the request
        if action == "error":
            return web.json_response({"error": {"message": "engine failed", "code": 500}}, status=500)
        if action == "error_stream":  # a 200 stream refused before any token (prompt too long)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"error": {"message": "prompt too long"}}\n\ndata: [DONE]\n\n')
            await response.write_eof()
            return response
        if action == "die":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        assert action == "ok", action
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"choices": [{"text": "ok"}]}\n\ndata: [DONE]\n\n')
            await response.write_eof()
            return response
        return web.json_response({"choices": [{"text": "ok"}]})

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        # handler_cancellation: a held request ends when the sidecar aborts it (not at cleanup)
        async with serve_aiohttp(app, handler_cancellation=True) as url:
            yield url


def prompt(tag: str) -> dict:
    return {"prompt": " ".join(f"{tag}{i}" for i in range(64)), "max_tokens": 4}


def matched_on(served: Listening, body: dict) -> dict[str, int]:
    """Matched tokens per worker in ``served``'s view for ``body``: what its policy would route on."""
    view = served.gateway.view
    parsed = parse_inference_request("/v1/completions", json.dumps(body).encode())
    workers = list(view.workers.values())
    hashes = view.request_hashes(parsed.token_bytes, parsed.tenant_salt, workers)
    rows = view.replica_states(workers, hashes, parsed.num_tokens, time.time())
    return {str(r.replica_id): r.matched_tokens for r in rows}


async def until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(500):  # bounded: 10 s
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


async def send(http: aiohttp.ClientSession, served: Listening, body: dict) -> tuple[int, str]:
    async with http.post(f"http://127.0.0.1:{served.port}/v1/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Prefixfleet-Worker", "")


async def settled(http: aiohttp.ClientSession, a: Listening, b: Listening, tag: str) -> str:
    """Route a fresh prompt through A until B counts it: A then shares its sends with B, and (the
    channel keeps A's order) B has applied every message A published before. Returns its worker."""
    for attempt in range(50):
        body = prompt(f"{tag}{attempt}x")
        status, worker = await send(http, a, body)
        assert status == 200
        for _ in range(25):
            if matched_on(b, body).get(worker):
                return worker
            await asyncio.sleep(0.02)
    raise AssertionError("gateway B never counted a send of gateway A")


@dataclass
class Fleet:
    engine: ScriptedEngine
    a: Listening
    b: Listening
    worker_of: dict[str, str]  # engine URL -> worker id


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[Fleet]:
    engine = ScriptedEngine()
    worker_of: dict[str, str] = {}
    async with AsyncExitStack() as stack:
        for i in range(2):
            url = await stack.enter_async_context(engine.serving())
            worker_of[url] = f"e{i}"
            config = SidecarConfig(
                engine_url=url,
                redis_url=redis_server.url,
                port=free_port(),
                worker_id=f"e{i}",
                fleet="withdraw",
                publish_interval_s=0.1,
                model="m",
                revision="r",
                cache_tokens=20000,
                prefill_tokens_per_s=30000.0,
            )
            await stack.enter_async_context(sidecar_listening(config))
        gateways = []
        for _ in range(2):
            config = GatewayConfig(
                port=0, redis_url=redis_server.url, fleet="withdraw", refresh_interval_s=0.05, max_retries=1
            )
            gateways.append(await stack.enter_async_context(listening(config)))
        a, b = gateways
        await until(
            lambda: all(len(g.gateway.view.routable(time.monotonic())) == 2 for g in gateways), "both workers"
        )
        yield Fleet(engine, a, b, worker_of)


@pytest.mark.timeout(60)
async def test_a_request_whose_client_leaves_before_its_first_token_is_withdrawn_from_the_peers(
    fleet: Fleet,
) -> None:
    engine, a, b = fleet.engine, fleet.a, fleet.b
    body = {**prompt("leaves"), "stream": True}
    async with aiohttp.ClientSession() as http:
        await settled(http, a, b, "warm")
        engine.script.append("hold")
        client = asyncio.create_task(send(http, a, body))
        await asyncio.wait_for(engine.held.wait(), 10)
        holder = fleet.worker_of[engine.served[-1][0]]
        # B learnt of the send and would route the prompt to its worker as a hit
        await until(lambda: matched_on(b, body)[holder] == 64, "gateway B to count A's send")
        client.cancel()  # the client leaves before its first token
        with pytest.raises(asyncio.CancelledError):
            await client
        await until(lambda: matched_on(a, body)[holder] == 0, "gateway A to withdraw its send")
        await until(lambda: matched_on(b, body)[holder] == 0, "gateway B to drop the withdrawn send")
        # a later send of the same prompt, answered, counts again everywhere
        status, worker = await send(http, a, body)
        assert status == 200
        await until(lambda: matched_on(b, body)[worker] == 64, "gateway B to count the later send")


@pytest.mark.timeout(60)
async def test_a_request_the_engine_fails_before_its_first_token_is_withdrawn_from_the_peers(
    fleet: Fleet,
) -> None:
    engine, a, b = fleet.engine, fleet.a, fleet.b
    body = prompt("fails")
    async with aiohttp.ClientSession() as http:
        await settled(http, a, b, "warm")
        engine.script.append("error")
        status, failed_on = await send(http, a, body)
        assert status == 500
        assert matched_on(a, body)[failed_on] == 0
        await settled(http, a, b, "after")  # B has applied everything A published up to here
        # (eventually: B may hold a summary the sidecar wrote before it withdrew the prompt too)
        await until(lambda: matched_on(b, body)[failed_on] == 0, "gateway B to drop the failed send")


@pytest.mark.timeout(60)
async def test_a_stream_whose_first_event_is_an_error_is_withdrawn_from_the_peers(fleet: Fleet) -> None:
    # The engine refused the prompt before any token (200, then an error event): nothing prefilled.
    engine, a, b = fleet.engine, fleet.a, fleet.b
    body = {**prompt("refused"), "stream": True}
    async with aiohttp.ClientSession() as http:
        await settled(http, a, b, "warm")
        engine.script.append("error_stream")
        status, failed_on = await send(http, a, body)
        assert status == 200
        assert matched_on(a, body)[failed_on] == 0
        await settled(http, a, b, "after")
        await until(lambda: matched_on(b, body)[failed_on] == 0, "gateway B to drop the refused send")


@pytest.mark.timeout(60)
async def test_a_request_retried_elsewhere_is_withdrawn_only_from_the_worker_that_failed(
    fleet: Fleet,
) -> None:
    engine, a, b = fleet.engine, fleet.a, fleet.b
    body = prompt("retried")
    async with aiohttp.ClientSession() as http:
        await settled(http, a, b, "warm")
        engine.script.extend(["die", "ok"])
        status, answered_by = await send(http, a, body)
        assert status == 200
        failed_on, retried_on = (fleet.worker_of[url] for url, _ in engine.served[-2:])
        assert failed_on != retried_on == answered_by
        await settled(http, a, b, "after")
        await until(
            lambda: matched_on(b, body) == {failed_on: 0, retried_on: 64}, "B to match the retry only"
        )


@pytest.mark.timeout(60)
async def test_a_static_worker_behind_a_shared_fleet_is_routed_without_a_send_notice(
    redis_server: RedisServer,
) -> None:
    # A static worker's id is its URL, which a send notice cannot carry: sharing it failed every
    # request with a 500 once a peer listened on the sends channel. Its sends stay local now.
    engine = ScriptedEngine()
    listener_client = aioredis.from_url(redis_server.url)
    listener = listener_client.pubsub(ignore_subscribe_messages=True)
    try:
        await listener.subscribe(FleetKeys("static").sends)  # a peer listens from the start
        async with (
            engine.serving() as url,
            listening(
                GatewayConfig(port=0, redis_url=redis_server.url, fleet="static", workers=(url,))
            ) as gw,
            aiohttp.ClientSession() as http,
        ):
            body = prompt("static")
            assert await send(http, gw, body) == (200, url)
            assert matched_on(gw, body)[url] == 64  # its own overlay still counts the send
            assert await listener.get_message(timeout=0.3) is None
    finally:
        await listener.aclose()
        await listener_client.aclose()


@pytest.mark.timeout(60)
async def test_unknown_and_malformed_sends_channel_messages_are_skipped_with_a_warning(
    fleet: Fleet, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # What a gateway that predates a message kind sees: a magic it does not know. It warns (at most
    # once a minute per message) and goes on counting its peers' sends.
    caplog.set_level(logging.WARNING, logger="prefixfleet.gateway")
    client = aioredis.from_url(redis_server.url)
    try:
        for junk in (b"PFZ9gw-x\ne0\n1.0\n", b"PFW1gw-x\ne0\nsoon\n", b"PFW1", "text"):
            await client.publish(FleetKeys("withdraw").sends, junk)
        async with aiohttp.ClientSession() as http:
            await settled(http, fleet.a, fleet.b, "after-junk")  # B applies A's sends after the junk
    finally:
        await client.aclose()
    warned = [r.getMessage() for r in caplog.records if "sends channel" in r.getMessage()]
    assert any("unknown message kind" in m for m in warned), warned
    assert any("send withdrawal: unreadable" in m for m in warned), warned


# -- counters --------------------------------------------------------------------------------------


async def counter(http: aiohttp.ClientSession, served: Listening, name: str, outcome: str) -> float:
    """A ``prefixfleet_gateway_<name>_total{outcome}`` sample as the gateway's /metrics serves it."""
    async with http.get(f"http://127.0.0.1:{served.port}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"prefixfleet_gateway_{name}_total" and sample.labels == {"outcome": outcome}:
                return sample.value
    raise AssertionError(f"no {name}{{outcome={outcome}}} on /metrics")


async def until_counter(
    http: aiohttp.ClientSession, served: Listening, name: str, outcome: str, value: float
) -> None:
    await until_async(
        lambda: counter(http, served, name, outcome), value, f"{name}{{outcome={outcome}}} = {value}"
    )


async def until_async(probe, expected: object, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(500):  # bounded: 10 s
        if await probe() == expected:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.mark.timeout(60)
async def test_withdrawals_are_counted_as_published_by_the_sender_and_applied_or_unknown_by_peers(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    engine, a, b = fleet.engine, fleet.a, fleet.b
    async with aiohttp.ClientSession() as http:
        for served in (a, b):  # every outcome is exported at 0 from the start
            for name, outcome in [
                ("send_withdrawals", "published"),
                ("send_withdrawals", "failed"),
                ("peer_send_withdrawals", "applied"),
                ("peer_send_withdrawals", "unknown"),
            ]:
                assert await counter(http, served, name, outcome) == 0
        await settled(http, a, b, "warm")  # successful sends withdraw nothing
        assert await counter(http, a, "send_withdrawals", "published") == 0
        engine.script.append("error")
        status, _ = await send(http, a, prompt("counted"))
        assert status == 500
        await until_counter(http, a, "send_withdrawals", "published", 1)
        await until_counter(http, b, "peer_send_withdrawals", "applied", 1)
        # a withdrawal of a send no gateway here has seen changes nothing and is counted as unknown
        client = aioredis.from_url(redis_server.url)
        try:
            await client.publish(FleetKeys("withdraw").sends, encode_withdraw("gw-x", "e0", 12.5, [1, 2]))
        finally:
            await client.aclose()
        await until_counter(http, a, "peer_send_withdrawals", "unknown", 1)
        await until_counter(http, b, "peer_send_withdrawals", "unknown", 1)
        assert await counter(http, b, "peer_send_withdrawals", "applied") == 1
        assert await counter(http, a, "send_withdrawals", "failed") == 0


async def sharing_again(http: aiohttp.ClientSession, a: Listening, redis_server: RedisServer) -> None:
    """After a Redis restart: until A publishes its sends again (it shares only while a peer listens,
    and the peers subscribe again with a backoff); a summary alone could not prove it."""
    client = aioredis.from_url(redis_server.url)
    listener = client.pubsub(ignore_subscribe_messages=True)
    channel = FleetKeys("withdraw").sends
    try:
        await until_async(lambda: client.pubsub_numsub(channel), [(channel.encode(), 2)], "both gateways")
        await listener.subscribe(channel)
        for attempt in range(100):  # bounded: ~10 s
            status, _ = await send(http, a, prompt(f"probe{attempt}x"))
            assert status == 200
            message = await listener.get_message(timeout=0.1)
            if message is not None and message["data"].startswith(b"PFX1"):
                return
        raise AssertionError("gateway A never shared a send again")
    finally:
        await listener.aclose()
        await client.aclose()


@pytest.mark.timeout(60)
async def test_withdrawals_lost_to_a_redis_outage_are_counted_and_logged_once(
    fleet: Fleet, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="prefixfleet.gateway")
    engine, a, b = fleet.engine, fleet.a, fleet.b
    async with aiohttp.ClientSession() as http:
        await settled(http, a, b, "warm")
        redis_server.stop()
        # the view is frozen during the outage: A still routes, and its withdrawals cannot go out
        for lost in (1, 2):
            engine.script.append("error")
            status, _ = await send(http, a, prompt(f"lost{lost}"))
            assert status == 500
            await until_counter(http, a, "send_withdrawals", "failed", lost)
        failures = [
            r.getMessage() for r in caplog.records if "publishing on the sends channel" in r.getMessage()
        ]
        assert len(failures) == 1, failures  # once per outage, with the reason, not once per request
        assert "failed (" in failures[0] and "2 withdrawals" not in failures[0]
        assert await counter(http, a, "send_withdrawals", "published") == 0
        redis_server.start()
        await sharing_again(http, a, redis_server)
        engine.script.append("error")
        status, _ = await send(http, a, prompt("after"))
        assert status == 500
        await until_counter(http, a, "send_withdrawals", "published", 1)
        assert await counter(http, a, "send_withdrawals", "failed") == 2
        await until_counter(http, b, "peer_send_withdrawals", "applied", 1)
    again = [r.getMessage() for r in caplog.records if "publishing again" in r.getMessage()]
    assert again == ["sends channel publishing again (2 send withdrawals were lost meanwhile)"], again
