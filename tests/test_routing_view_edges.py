"""Edge states of a gateway's fleet view (pure: FleetView fed records by hand).

* A sidecar that restarts under the same worker id (its seq starts again; it has published no
  summary yet) starts with an empty mirror: the gateway must stop routing on the summary of the
  sidecar before it, and on its own sends from before the old sidecar's last heartbeat.
* A foreign load record whose figures overflow the wait (2**63 pending tokens at 1e-300 tokens/s)
  must not attract traffic: the default policy's score was NaN there, and min() kept it.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.policies import POLICIES, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.router.summary import MAX_RECORD_INT, encode_summary, make_summary
from prefixfleet.router.view import FleetView, WorkerView

B = 4
SEED = CacheIdentity("m", "r").seed()
PROMPT = as_token_bytes(list(range(40)))


def member() -> str:
    return encode_record(MemberRecord(url="http://127.0.0.1:9", model="m", revision="r", block_tokens=B))


def load(seq: int, ts: float, summary_version: int, cached: int = 0, **kw: object) -> str:
    fields = dict(
        seq=seq, ts=ts, state="ready", engine_ok=True, in_flight=0, queued=0, pending_prefill_tokens=0,
        prefill_tokens_per_s=1000.0, cached_tokens=cached, capacity_tokens=100,
        summary_version=summary_version,
    )  # fmt: skip
    fields.update(kw)
    return encode_record(LoadReport(**fields))  # type: ignore[arg-type]


def matched(view: FleetView, wall: float) -> dict[str, int]:
    workers = view.routable(0.0)
    hashes = view.request_hashes(PROMPT, None, workers)
    return {str(r.replica_id): r.matched_tokens for r in view.replica_states(workers, hashes, 40, wall)}


def _view_with_a_holding_the_prompt() -> tuple[FleetView, list[int]]:
    view = FleetView(block_tokens=B)
    view.apply_snapshot(
        {"a": member(), "b": member()}, {"a": load(50, 100.0, 7, 40), "b": load(50, 100.0, 3)}, 0.0
    )
    chain = view.request_hashes(PROMPT, None, [view.workers["a"]])[(SEED, B)]
    summary = make_summary(
        worker="a", version=7, generated_at=100.0, block_tokens=B, identity_seed=SEED,
        cached_tokens=40, capacity_tokens=100, blocks=chain,
    )  # fmt: skip
    assert view.apply_summary("a", encode_summary(summary)) is None
    assert matched(view, 100.0) == {"a": 40, "b": 0}
    return view, chain


def test_a_restarted_sidecar_is_not_routed_on_its_predecessors_summary():
    view, _ = _view_with_a_holding_the_prompt()
    # a's sidecar restarts (its engine with it): seq from 1, no summary published yet, empty mirror
    result = view.apply_snapshot(
        {"a": member(), "b": member()}, {"a": load(1, 200.0, 0), "b": load(51, 200.0, 3)}, 0.5
    )
    assert matched(view, 200.0) == {"a": 0, "b": 0}
    assert "a" not in result.need_summaries
    # its first summary is fetched as usual
    result = view.apply_snapshot(
        {"a": member(), "b": member()}, {"a": load(2, 200.3, 1), "b": load(52, 200.3, 3)}, 0.7
    )
    assert "a" in result.need_summaries


def test_a_restart_seen_after_the_new_sidecar_published_fetches_its_summary():
    view, _ = _view_with_a_holding_the_prompt()
    # the new sidecar's seq is lower but it already wrote summary 1: drop the old one, fetch the new
    result = view.apply_snapshot(
        {"a": member(), "b": member()}, {"a": load(3, 200.0, 1), "b": load(51, 200.0, 3)}, 0.5
    )
    assert view.workers["a"].summary is None and "a" in result.need_summaries


def test_sends_before_the_old_sidecars_last_heartbeat_are_forgotten_later_ones_kept():
    view = FleetView(block_tokens=B)
    view.apply_snapshot({"a": member()}, {"a": load(50, 100.0, 0)}, 0.0)
    chain = view.request_hashes(PROMPT, None, [view.workers["a"]])[(SEED, B)]
    view.record_send("a", chain[:5], 20, wall_now=99.0)  # reached the old sidecar (reported at 100)
    assert matched(view, 101.0) == {"a": 20}
    view.apply_snapshot({"a": member()}, {"a": load(1, 101.0, 0)}, 0.5)  # restarted
    assert matched(view, 101.5) == {"a": 0}
    view.record_send("a", chain, 40, wall_now=101.6)  # the new sidecar's own
    view.apply_snapshot({"a": member()}, {"a": load(2, 101.7, 0)}, 0.7)  # no restart: kept
    assert matched(view, 101.8) == {"a": 40}


def test_records_arriving_out_of_order_from_one_sidecar_keep_its_summary():
    view, _ = _view_with_a_holding_the_prompt()
    view.apply_load("a", LoadReport(51, 100.25, "ready", True, 0, 0, 0, 1000.0, 40, 100, 7), 0.25)
    view.apply_snapshot(
        {"a": member(), "b": member()}, {"a": load(50, 100.0, 7, 40), "b": load(51, 100.25, 3)}, 0.3
    )
    view.apply_load("a", LoadReport(52, 100.5, "ready", True, 0, 0, 0, 1000.0, 40, 100, 8), 0.5)
    assert view.workers["a"].summary is not None
    assert matched(view, 100.6)["a"] == 40


@settings(max_examples=40, deadline=None)
@given(
    pending=st.integers(0, MAX_RECORD_INT),
    rate=st.floats(1e-300, 1e9),
    fixed=st.floats(0.0, 1e308),
    policy=st.sampled_from(sorted(POLICIES)),
)
def test_a_foreign_load_record_never_wins_over_an_idle_replica(pending, rate, fixed, policy):
    view = FleetView(block_tokens=B)
    foreign = load(
        1, 100.0, 0, pending_prefill_tokens=pending, prefill_tokens_per_s=rate, fixed_latency_s=fixed
    )
    view.apply_snapshot({"odd": member(), "idle": member()}, {"odd": foreign, "idle": load(1, 100.0, 0)}, 0.0)
    workers = view.routable(0.0)
    rows = view.replica_states(workers, view.request_hashes(PROMPT, None, workers), 40, 100.0)
    assert all(math.isfinite(r.wait_s) for r in rows)
    if policy in ("round_robin", "affinity", "sglang_cache_aware"):
        return  # blind to the wait by design (sglang_cache_aware counts requests in flight)
    odd_wait = next(r.wait_s for r in rows if r.replica_id == "odd")
    if odd_wait < 1.0:
        return  # not an absurd record: either may win
    decision = make_policy(policy).choose(RouteRequest(PROMPT, 40, now=100.0), rows)
    assert decision.replica_id == "idle"
    assert not any(math.isnan(s) for s in decision.scores.values())


def linear_walk(w: WorkerView, chain: list[int], floor: float) -> int:
    """Leading blocks of ``chain`` in the summary or stamped at or after ``floor`` (no search)."""
    blocks = 0
    for h in chain:
        if not ((w.summary is not None and w.summary.has_block(h)) or w.overlay.get(h, -math.inf) >= floor):
            break
        blocks += 1
    return blocks


def test_a_late_peer_notice_does_not_make_a_hit_of_a_gap_in_the_chain():
    """Peer notices arrive out of order with own sends: an older stamp written over a newer one left
    a parent older than its child, and the binary search over summary ∪ overlay (which needs them
    prefix-closed) counted blocks past a gap as cached."""
    view = FleetView(block_tokens=B, overlay_ttl_s=30.0)
    view.apply_snapshot({"a": member()}, {"a": load(1, 100.0, 0)}, 0.0)
    w = view.workers["a"]
    chain = view.request_hashes(PROMPT, None, [w])[(SEED, B)][:3]
    view.record_send("a", chain, 12, wall_now=105.0)  # own send: the whole chain
    view.record_peer_send("a", chain[:2], sent_at=104.9)  # a peer's, sent just before, arrives now
    # the summary generated 0.95 s after the own send shows only the first block (the rest evicted)
    summary = make_summary(
        worker="a", version=1, generated_at=105.95, block_tokens=B, identity_seed=SEED,
        cached_tokens=4, capacity_tokens=100, blocks=chain[:1],
    )  # fmt: skip
    assert view.apply_summary("a", encode_summary(summary)) is None
    assert view.matched_tokens(w, chain, B, wall_now=106.0) == linear_walk(w, chain, 105.95 - 1.0) * B


@settings(max_examples=80, deadline=None)
@given(
    sends=st.lists(
        st.tuples(st.integers(1, 6), st.floats(0, 60), st.booleans()),  # blocks, time, peer's
        max_size=8,
    ),
    summary_blocks=st.integers(0, 6),
    generated_at=st.floats(0, 60),
    now=st.floats(0, 90),
)
def test_matched_tokens_equal_a_linear_walk_whatever_order_sends_arrive_in(
    sends, summary_blocks, generated_at, now
):
    view = FleetView(block_tokens=B, overlay_ttl_s=30.0)
    view.apply_snapshot({"a": member()}, {"a": load(1, 100.0, 0)}, 0.0)
    w = view.workers["a"]
    chain = view.request_hashes(PROMPT, None, [w])[(SEED, B)][:6]
    for blocks, t, peer in sends:  # in arrival order, not time order
        if peer:
            view.record_peer_send("a", chain[:blocks], sent_at=t)
        else:
            view.record_send("a", chain[:blocks], 0, wall_now=t)
    summary = make_summary(
        worker="a", version=1, generated_at=generated_at, block_tokens=B, identity_seed=SEED,
        cached_tokens=0, capacity_tokens=100, blocks=chain[:summary_blocks],
    )  # fmt: skip
    assert view.apply_summary("a", encode_summary(summary)) is None
    floor = max(now - 30.0, generated_at - 1.0)
    assert view.matched_tokens(w, chain, B, wall_now=now) == linear_walk(w, chain, floor) * B
