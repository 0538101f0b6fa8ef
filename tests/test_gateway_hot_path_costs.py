"""The gateway's per-request shortcuts: the same answers as the plain computations they replace, and
what need not precede an exchange (metrics, bookkeeping) done off its path."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from fleet_fixtures import RedisServer, eventually, serve_aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from prefixfleet.router.front import HotRequest, _FrontConnection
from prefixfleet.router.gateway import Gateway, GatewayConfig, listening
from prefixfleet.router.gateway_metrics import GatewayMetrics
from prefixfleet.router.hotspots import HotSubtree
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.router.redis_conn import connect_redis
from prefixfleet.router.slow_clients import ClientTimeouts
from prefixfleet.router.view import MAX_RECENT_DONE, FleetView, ended_since

# wall-clock readings as a gateway may take them: mostly rising, sometimes stepping back (NTP)
_steps = st.lists(st.floats(min_value=-5.0, max_value=5.0, allow_nan=False), min_size=1, max_size=700)


def _reference(view: FleetView, worker_id: str, ts: float) -> list[tuple[float, float]]:
    """The scan ended_since replaces: every remembered end, in deque order."""
    w = view.workers[worker_id]
    return [(d.sent_at, d.done_at) for d in w.done if d.sent_at <= ts < d.done_at]


@settings(max_examples=100, deadline=None)
@given(
    steps=_steps,
    durations=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=50),
    probes=st.lists(st.floats(min_value=-50.0, max_value=3600.0, allow_nan=False), min_size=1, max_size=8),
)
def test_ended_since_finds_exactly_the_sends_a_full_scan_finds(
    steps: list[float], durations: list[float], probes: list[float]
) -> None:
    view = FleetView()
    w = view.add_static("http://w")
    clock = 1000.0
    for i, step in enumerate(steps):
        # a step back of the clock, now and then, between a send and its end or between two ends
        clock += step if step < -4.0 else abs(step)
        handle = view.record_send(w.worker_id, [], 16, clock)
        view.record_done(w.worker_id, handle, clock + durations[i % len(durations)])
        for probe in probes:
            ts = 1000.0 + probe
            got = sorted((d.sent_at, d.done_at) for d in ended_since(w, ts))
            assert got == sorted(_reference(view, w.worker_id, ts))
    assert len(w.done) == min(len(steps), MAX_RECENT_DONE)


def test_ended_since_reads_only_the_ends_after_the_report_when_in_order() -> None:
    view = FleetView()
    w = view.add_static("http://w")
    for i in range(MAX_RECENT_DONE):
        handle = view.record_send(w.worker_id, [], 16, 100.0 + i)
        view.record_done(w.worker_id, handle, 100.5 + i)
    assert w.done_unordered == 0
    # a report written at 355.2 counts the send of 355.0 (ended 355.5) only: 354.0's ended at 354.5
    # and 356.0's was sent after it
    assert [d.sent_at for d in ended_since(w, 355.2)] == [355.0]
    assert ended_since(w, 1e9) == []
    # the clock steps back: the order is not trusted until that end left the deque
    handle = view.record_send(w.worker_id, [], 16, 50.0)
    view.record_done(w.worker_id, handle, 60.0)
    assert w.done_unordered == MAX_RECENT_DONE
    assert [d.sent_at for d in ended_since(w, 55.0)] == [50.0]
    for i in range(MAX_RECENT_DONE):
        handle = view.record_send(w.worker_id, [], 16, 1000.0 + i)
        view.record_done(w.worker_id, handle, 1000.5 + i)
    assert w.done_unordered == 0
    assert [d.sent_at for d in ended_since(w, 1255.2)] == [1255.0]


def _hot_series(metrics: GatewayMetrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith("prefixfleet_gateway_hot_subtree")]


_holders = st.lists(st.tuples(st.sampled_from(["w0", "w1", "w2"]), st.integers(0, 9)), max_size=3)
_ranked = st.lists(st.tuples(st.integers(1, 99), st.integers(0, 99), _holders), max_size=4).map(
    lambda rows: [
        HotSubtree(rank=i + 1, tokens=tokens, hits=hits, holders=tuple(holders))
        for i, (tokens, hits, holders) in enumerate(rows)
    ]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_ranked, min_size=1, max_size=6))
def test_hot_subtree_series_updated_in_place_equal_a_rebuild(rankings: list[list[HotSubtree]]) -> None:
    """Values set on the kept children when the series stay the same, a rebuild when they change:
    after every ranking the exported series are those of a gateway that only ever saw that one."""
    metrics = GatewayMetrics()
    for ranked in rankings:
        # each ranking, then the same series with other values (the in-place case)
        bumped = [
            HotSubtree(s.rank, s.tokens + 1, s.hits + 2, tuple((w, h + 3) for w, h in s.holders))
            for s in ranked
        ]
        for shown in (ranked, bumped):
            metrics.set_hot_subtrees(shown)
            fresh = GatewayMetrics()
            fresh.set_hot_subtrees(shown)
            assert _hot_series(metrics) == _hot_series(fresh)


def _sidecar() -> web.Application:
    async def generate(_request: web.Request) -> web.Response:
        return web.json_response({"text": "ok", "meta_info": {"prompt_tokens": 3, "cached_tokens": 0}})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    return app


async def test_the_answer_is_written_before_the_requests_bookkeeping_and_metrics_after_its_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What need not precede an exchange stays off its path: a decision's metrics are recorded once
    the request went to the worker, and the client's answer is written before the request's end is
    booked (its worker's in-flight count, the answered-requests metrics). Both were done first."""
    events: list[tuple[str, bool]] = []
    async with (
        serve_aiohttp(_sidecar()) as worker,
        listening(GatewayConfig(port=0, workers=(worker,), health_interval_s=3600)) as served,
        aiohttp.ClientSession() as http,
    ):
        gateway = served.gateway
        assert gateway.upstream is not None
        running: list[HotRequest] = []
        handle = gateway.handle_generate

        async def generate(request: HotRequest) -> object:
            running.append(request)
            return await handle(request)

        served.front.handlers["/generate"] = generate
        send, routed = gateway.upstream.send, gateway.metrics.routed
        record_done, answered = gateway.view.record_done, gateway.metrics.request_answered

        def sent_yet() -> bool:
            return bool(running) and running[-1].sent

        async def traced_send(*args: Any, **kwargs: Any) -> Any:
            exchange = await send(*args, **kwargs)
            events.append(("upstream send", sent_yet()))
            return exchange

        def traced(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                events.append((name, sent_yet()))
                return call(*args, **kwargs)

            return wrapper

        monkeypatch.setattr(gateway.upstream, "send", traced_send)
        monkeypatch.setattr(gateway.metrics, "routed", traced("routed", routed))
        monkeypatch.setattr(gateway.view, "record_done", traced("record_done", record_done))
        monkeypatch.setattr(gateway.metrics, "request_answered", traced("answered", answered))
        body = {"text": "one two three", "sampling_params": {"max_new_tokens": 1}}
        async with http.post(f"http://127.0.0.1:{served.port}/generate", json=body) as resp:
            assert resp.status == 200
            assert (await resp.json())["text"] == "ok"
        await eventually(lambda: events, 10.0, "the request's end booked", done=lambda got: len(got) == 4)
    # (name, whether the client's answer had been written by then)
    assert events == [("upstream send", False), ("routed", False), ("record_done", True), ("answered", True)]


def _load(seq: int, in_flight: int) -> bytes:
    return encode_record(
        LoadReport(
            seq=seq, ts=time.time(), state="ready", engine_ok=True, in_flight=in_flight, queued=0,
            pending_prefill_tokens=0, prefill_tokens_per_s=1000.0, cached_tokens=0,
            capacity_tokens=1000, summary_version=0,
        )
    )  # fmt: skip


@pytest.mark.timeout(60)
async def test_a_refresh_reads_known_members_loads_in_the_members_round_trip(
    redis_server: RedisServer,
) -> None:
    """Five refreshes a second: the members hash and the loads of the members it held last time
    are read in one round trip (they were two); a member new since has its load read after."""
    fleet = "hotpathrefresh"
    keys = FleetKeys(fleet)
    client = aioredis.from_url(redis_server.url)
    gateway = Gateway(GatewayConfig(port=0, redis_url=redis_server.url, fleet=fleet))
    gateway.redis = connect_redis(redis_server.url, timeout_s=5.0)
    trips: list[str] = []
    pipeline, mget = gateway.redis.pipeline, gateway.redis.mget

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        trips.append("pipeline")
        return pipeline(*args, **kwargs)

    async def counted_mget(*args: Any, **kwargs: Any) -> Any:
        trips.append("mget")
        return await mget(*args, **kwargs)

    gateway.redis.pipeline = counted_pipeline  # type: ignore[method-assign]
    gateway.redis.mget = counted_mget  # type: ignore[method-assign]
    try:
        await client.hset(keys.members, "w0", encode_record(MemberRecord(url="http://127.0.0.1:9")))
        await client.set(keys.load("w0"), _load(1, 3))
        await gateway.refresh_once()  # w0 is new: its load is read after the members
        assert trips == ["pipeline", "mget"]
        assert gateway.view.workers["w0"].load.in_flight == 3  # type: ignore[union-attr]

        trips.clear()
        await client.set(keys.load("w0"), _load(2, 5))
        await gateway.refresh_once()
        assert trips == ["pipeline"]
        assert gateway.view.workers["w0"].load.in_flight == 5  # type: ignore[union-attr]

        trips.clear()
        await client.hset(keys.members, "w1", encode_record(MemberRecord(url="http://127.0.0.1:10")))
        await client.set(keys.load("w1"), _load(1, 7))
        await client.set(keys.load("w0"), _load(3, 6))
        await gateway.refresh_once()
        assert trips == ["pipeline", "mget"]
        assert {w: v.load.in_flight for w, v in gateway.view.workers.items() if v.load} == {"w0": 6, "w1": 7}

        trips.clear()
        await client.hdel(keys.members, "w0")
        await client.set(keys.load("w1"), _load(2, 1))
        await gateway.refresh_once()
        assert trips == ["pipeline"]
        assert gateway.view.workers["w1"].load.in_flight == 1  # type: ignore[union-attr]
    finally:
        await gateway.redis.aclose()
        await client.aclose()


class _Clock:
    """A loop's time and timers, run by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[tuple[float, Callable[[], object], list[bool]]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], object]) -> Any:
        cancelled = [False]
        self.armed.append((self.now + delay, callback, cancelled))
        return SimpleNamespace(cancel=lambda: cancelled.__setitem__(0, True))

    def run_until(self, when: float) -> None:
        """Fire every timer due by ``when``, in order."""
        while True:
            due = sorted((t, i) for i, (t, _, c) in enumerate(self.armed) if t <= when and not c[0])
            if not due:
                break
            t, i = due[0]
            self.now = max(self.now, t)
            _, callback, cancelled = self.armed[i]
            cancelled[0] = True  # fired
            callback()
        self.now = when


def test_a_front_connection_keeps_one_idle_timer_across_requests_and_closes_at_the_limit() -> None:
    """The idle limit counts from the end of the last request, as before, but requests no longer
    cancel and arm a timer each: the one armed fires early and re-arms for the rest."""
    clock = _Clock()
    closed: list[float] = []
    front = SimpleNamespace(loop=clock, timeouts=ClientTimeouts(idle_s=30.0), connections=set())
    conn = _FrontConnection(front)  # type: ignore[arg-type]
    conn.connection_made(SimpleNamespace(close=lambda: closed.append(clock.now)))  # type: ignore[arg-type]
    for end in range(1, 101):  # a request ending every 0.25 s for 25 s
        clock.run_until(end * 0.25)
        conn._arm_idle()  # what a request's end does (_done)
    assert len(clock.armed) == 1  # one timer for a hundred requests (a hundred before)
    clock.run_until(30.0)  # the first timer fires: 5 s since the last request, not idle yet
    assert closed == []
    clock.run_until(54.99)
    assert closed == []
    clock.run_until(60.0)
    assert closed == [55.0]  # 30 s after the last request ended
