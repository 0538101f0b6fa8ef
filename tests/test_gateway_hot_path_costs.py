"""The gateway's per-request shortcuts give the answers of the plain computations they replace."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from prefixfleet.router.gateway_metrics import GatewayMetrics
from prefixfleet.router.hotspots import HotSubtree
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
