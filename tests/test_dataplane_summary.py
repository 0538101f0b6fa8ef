"""Summary format, block hashing and the gateway's fleet view: pure logic, no processes."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity, block_hashes, salted_seed
from prefixfleet.router.loadtrack import LoadTracker
from prefixfleet.router.mirror import CacheMirror
from prefixfleet.router.radix import RadixTree, as_token_bytes
from prefixfleet.router.records import LoadReport, MemberRecord, decode_load, decode_member, encode_record
from prefixfleet.router.requests import BadRequest, inference_request, load_json_body, parse_inference_request
from prefixfleet.router.summary import (
    FORMAT_VERSION,
    HotNode,
    SummaryError,
    build_summary,
    decode_summary,
    encode_summary,
    make_summary,
)
from prefixfleet.router.tenancy import salted_body
from prefixfleet.router.view import FleetView

B = 4  # small blocks keep the examples readable
SEED = CacheIdentity("m", "r").seed()

hashes64 = st.integers(min_value=0, max_value=2**64 - 1)
hot_nodes = st.builds(
    HotNode,
    hash=hashes64,
    tokens=st.integers(0, 10**7),
    hits=st.integers(0, 10**9),
    last_access=st.floats(0, 2e9, allow_nan=False),
)
summaries = st.builds(
    make_summary,
    worker=st.text(min_size=1, max_size=20),
    version=st.integers(0, 2**40),
    generated_at=st.floats(0, 2e9, allow_nan=False),
    block_tokens=st.integers(1, 512),
    identity_seed=hashes64,
    cached_tokens=st.integers(0, 10**9),
    capacity_tokens=st.integers(0, 10**9),
    blocks=st.lists(hashes64, max_size=200),
    hot=st.lists(hot_nodes, max_size=8),
    truncated=st.booleans(),
)


@given(summaries)
def test_summary_round_trips_through_its_wire_format(summary):
    decoded = decode_summary(encode_summary(summary))
    assert decoded == summary
    assert list(decoded.blocks) == list(summary.blocks) == sorted(set(summary.blocks))


@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_with_summary_error_only(data):
    with pytest.raises(SummaryError):
        decode_summary(data)


def _valid() -> bytes:
    s = make_summary(
        worker="w",
        version=3,
        generated_at=1.0,
        block_tokens=16,
        identity_seed=SEED,
        cached_tokens=10,
        capacity_tokens=100,
        blocks=[5, 1, 9],
    )
    return encode_summary(s)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d[:-3], "bytes of block hashes"),
        (lambda d: b"XYZ" + d[3:], "bad magic"),
        (lambda d: d[:3] + bytes([FORMAT_VERSION + 1]) + d[4:], "unsupported summary format version"),
        (lambda d: d[:8] + b"x" + d[9:], "not JSON"),
        (lambda d: d.replace(b'"cached_tokens":10', b'"cached_tokens":-1'), "must not be negative"),
        (lambda d: d.replace(b'"worker":"w"', b'"worker":7  '), "'worker'"),
        (lambda d: d[:-24] + d[-8:] + d[-16:-8] + d[-24:-16], "sorted"),
    ],
)
def test_malformed_summaries_name_what_is_wrong(mutate, reason):
    with pytest.raises(SummaryError, match=reason):
        decode_summary(mutate(_valid()))


def test_block_hashes_name_whole_prefixes_under_one_identity():
    a = list(range(100, 120))
    b = [*a[:8], 999, *a[9:]]
    ha, hb = block_hashes(a, SEED, B), block_hashes(b, SEED, B)
    assert len(ha) == 5
    assert ha[:2] == hb[:2] and all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))
    assert block_hashes(a[:7], SEED, B) == ha[:1]  # a partial last block is not named
    other_model = CacheIdentity("m", "r2").seed()
    assert set(block_hashes(a, other_model, B)).isdisjoint(ha)
    assert set(block_hashes(a, salted_seed(SEED, "tenant-a"), B)).isdisjoint(ha)
    assert salted_seed(SEED, None) == salted_seed(SEED, "") == SEED


def _tree_with(seqs: list[list[int]], capacity: int = 10_000) -> RadixTree:
    tree = RadixTree(capacity)
    for s in seqs:
        tree.insert(s)
    return tree


def _summary_of(tree: RadixTree, max_blocks: int = 10**6):
    summary, _ = build_summary(
        tree,
        worker="w",
        version=1,
        now=100.0,
        identity_seed=SEED,
        block_tokens=B,
        namespace_seed=lambda ns: salted_seed(SEED, ns),
        wall_time_of=float,
        max_blocks=max_blocks,
    )
    return summary


token_seqs = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=30), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(token_seqs, st.lists(st.lists(st.integers(0, 5), max_size=30), min_size=1, max_size=6))
def test_view_matched_tokens_equal_the_radix_trees_match_floored_to_blocks(seqs, queries):
    tree = _tree_with(seqs)
    view = FleetView(block_tokens=B)
    w = view.add_static("http://w")
    w.summary = _summary_of(tree)
    for q in queries + seqs:
        chain = block_hashes(q, SEED, B)
        expected = (tree.matched_tokens(q) // B) * B
        assert view.matched_tokens(w, chain, B, wall_now=100.0) == expected


@settings(max_examples=100, deadline=None)
@given(token_seqs, st.integers(1, 20))
def test_a_capped_summary_stays_prefix_closed(seqs, cap):
    tree = _tree_with(seqs)
    summary = _summary_of(tree, max_blocks=cap)
    assert len(summary.blocks) <= cap
    for seq in tree.cached_sequences():
        present = [summary.has_block(h) for h in block_hashes(seq, SEED, B)]
        assert present == sorted(present, reverse=True), "a kept block's parent was dropped"


def test_a_capped_summary_keeps_the_most_recently_used_prefixes():
    old, new = list(range(0, 40)), list(range(100, 140))
    tree = _tree_with([old, new])
    summary = _summary_of(tree, max_blocks=10)
    assert all(summary.has_block(h) for h in block_hashes(new, SEED, B))
    assert not summary.has_block(block_hashes(old, SEED, B)[0])
    assert summary.truncated


def test_hot_nodes_carry_hashes_lengths_and_hits_but_never_tokens():
    mirror = CacheMirror(10_000, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 50.0)
    system = list(range(1000, 1012))
    for i in range(5):
        mirror.admit(as_token_bytes([*system, 7000 + i, 7100 + i, 7200 + i, 7300 + i]), None)
    summary = mirror.summary(worker="w", version=1)
    top = max(summary.hot, key=lambda n: n.hits)
    assert top.tokens == 12 and top.hits >= 5
    assert top.hash == block_hashes(system, mirror.identity_seed, B)[-1]
    encoded = encode_summary(summary)
    assert as_token_bytes(system[:2]) not in encoded
    # the real prefix stays in the sidecar, for pre-warming another replica
    assert mirror.hot_prefixes[top.hash].token_bytes == as_token_bytes(system)


def test_mirror_learns_when_the_engine_reports_fewer_cached_tokens():
    mirror = CacheMirror(1000, CacheIdentity(), block_tokens=B, clock=lambda: 0.0)
    mirror.admit(as_token_bytes(list(range(40))), None)
    mirror.admit(as_token_bytes(list(range(100, 140))), None)
    predicted = mirror.admit(as_token_bytes([*list(range(40)), 1, 2]), None)
    assert predicted == 40
    assert mirror.correct(predicted, 0, ran_alone=False) == 0  # concurrent: not evidence
    assert mirror.correct(predicted, 0, ran_alone=True) >= 40
    assert mirror.tree.cached_tokens <= 42


# -- the view: overlay, liveness, load ---------------------------------------------------------------


def _member(url: str = "http://127.0.0.1:9") -> str:
    return encode_record(MemberRecord(url=url, model="m", revision="r", block_tokens=B))


def _load(
    seq: int,
    *,
    ts: float = 0.0,
    state: str = "ready",
    in_flight: int = 0,
    pending: int = 0,
    summary_version: int = 0,
) -> str:
    return encode_record(
        LoadReport(
            seq=seq,
            ts=ts,
            state=state,
            engine_ok=True,
            in_flight=in_flight,
            queued=0,
            pending_prefill_tokens=pending,
            prefill_tokens_per_s=1000.0,
            cached_tokens=0,
            capacity_tokens=100,
            summary_version=summary_version,
        )
    )


def test_own_recent_sends_count_as_cached_until_a_newer_summary_arrives():
    view = FleetView(block_tokens=B, overlay_ttl_s=30.0)
    view.apply_snapshot({"w1": _member(), "w2": _member()}, {"w1": _load(1), "w2": _load(1)}, now=0.0)
    prompt = as_token_bytes(list(range(50, 70)))
    w1 = view.workers["w1"]
    chain = view.request_hashes(prompt, None, [w1])[(SEED, B)]
    view.record_send("w1", chain, 20, wall_now=1000.0)
    rows = {
        r.replica_id: r
        for r in view.replica_states(list(view.workers.values()), {(SEED, B): chain}, 20, wall_now=1000.5)
    }
    assert rows["w1"].matched_tokens == 20 and rows["w2"].matched_tokens == 0
    # A summary generated well after the send is authoritative: it shows the prefix was evicted.
    empty = make_summary(
        worker="w1",
        version=2,
        generated_at=1005.0,
        block_tokens=B,
        identity_seed=SEED,
        cached_tokens=0,
        capacity_tokens=100,
        blocks=[],
    )
    assert view.apply_summary("w1", encode_summary(empty)) is None
    assert view.matched_tokens(w1, chain, B, wall_now=1006.0) == 0
    view.prune_overlays(1006.0)
    assert not w1.overlay


def test_unreported_sends_add_to_reported_load():
    view = FleetView(block_tokens=B)
    view.apply_snapshot({"w1": _member()}, {"w1": _load(1, ts=100.0, in_flight=2, pending=500)}, now=0.0)
    w1 = view.workers["w1"]
    view.record_send("w1", [], 300, wall_now=99.0)  # already in the report
    view.record_send("w1", [], 200, wall_now=101.0)  # not yet
    (row,) = view.replica_states([w1], {(SEED, B): []}, 10, wall_now=101.0)
    assert (row.in_flight, row.pending_prefill_tokens) == (3, 700)
    assert row.wait_s == pytest.approx(0.7)


def test_own_sends_that_ended_after_the_last_report_no_longer_count_as_load():
    view = FleetView(block_tokens=B)
    view.apply_snapshot({"w1": _member()}, {"w1": _load(1, ts=100.0, in_flight=1, pending=400)}, now=0.0)
    w1 = view.workers["w1"]
    handle = view.record_send("w1", [], 400, wall_now=99.9)  # the report counts it...
    view.record_done("w1", handle, wall_now=100.2)  # ...but it has ended since
    (row,) = view.replica_states([w1], {(SEED, B): []}, 10, wall_now=100.3)
    assert (row.in_flight, row.pending_prefill_tokens, row.wait_s) == (0, 0, 0.0)
    view.apply_snapshot({"w1": _member()}, {"w1": _load(2, ts=100.5)}, now=0.5)  # a fresh report
    (row,) = view.replica_states([w1], {(SEED, B): []}, 10, wall_now=100.6)
    assert (row.in_flight, row.pending_prefill_tokens) == (0, 0)


def test_workers_die_by_stale_heartbeat_but_a_redis_outage_freezes_the_view():
    view = FleetView(block_tokens=B, dead_after_s=3.0)
    view.apply_snapshot({"w1": _member(), "w2": _member()}, {"w1": _load(1), "w2": _load(1)}, now=0.0)
    view.apply_snapshot({"w1": _member(), "w2": _member()}, {"w1": _load(2), "w2": _load(1)}, now=2.0)
    view.apply_snapshot({"w1": _member(), "w2": _member()}, {"w1": _load(3), "w2": _load(1)}, now=4.0)
    assert [w.worker_id for w in view.routable(4.0)] == ["w1"]  # w2's seq stopped 4 s ago
    # Redis unreachable from now on: no snapshot; w1 must stay routable however long it lasts.
    assert [w.worker_id for w in view.routable(60.0)] == ["w1"]
    # Redis came back empty (restart): keep the view briefly while sidecars re-register.
    result = view.apply_snapshot({}, {}, now=61.0)
    assert "w1" in view.workers and not result.removed
    view.apply_snapshot({}, {}, now=65.0)
    assert "w1" not in view.workers


def test_draining_and_warming_workers_get_no_new_requests():
    view = FleetView(block_tokens=B)
    loads = {"a": _load(1, state="draining"), "b": _load(1, state="warming"), "c": _load(1)}
    view.apply_snapshot({k: _member() for k in loads}, loads, now=0.0)
    assert [w.worker_id for w in view.routable(0.0)] == ["c"]
    # an operator marks the member record draining while the sidecar still reports ready
    members = {k: _member() for k in loads}
    members["c"] = encode_record(MemberRecord(url="http://127.0.0.1:9", state="draining"))
    view.apply_snapshot(members, {k: _load(2) for k in loads}, now=1.0)
    assert [w.worker_id for w in view.routable(1.0)] == ["a", "b"]


def test_malformed_records_are_reported_and_skipped():
    view = FleetView(block_tokens=B)
    members = {"ok": _member(), "bad": "{not json", "odd": json.dumps({"v": 1, "url": "ftp://x"})}
    loads = {"ok": "[]", "bad": None, "odd": None}
    result = view.apply_snapshot(members, loads, now=0.0)
    assert len(result.warnings) == 3
    assert set(view.workers) == {"ok"} and not view.routable(0.0)
    assert "names worker" in view.apply_summary("ok", _valid())  # a summary filed under another id


def test_records_round_trip():
    member = MemberRecord(url="http://h:1", state="warming", model="m", revision="r", adapter="a")
    assert decode_member(encode_record(member)) == member
    load = LoadReport(1, 2.0, "ready", True, 3, 1, 40, 5.0, 6, 7, 8)
    assert decode_load(encode_record(load)) == load


# -- request parsing and load tracking -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/generate", b"{oops", 400, "not valid JSON"),
        ("/generate", b"[1]", 400, "JSON object"),
        ("/generate", b"{}", 400, "'text' and 'input_ids'"),
        ("/generate", b'{"text": 5}', 400, "'text'"),
        ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": "x"}}', 400, "max_new_tokens"),
        ("/generate", b'{"input_ids": [1, -2]}', 400, "input_ids[1]"),
        ("/v1/completions", b'{"model": "m"}', 400, "'prompt' is required"),
        ("/v1/completions", b'{"prompt": "a", "stream": "maybe"}', 400, "'stream'"),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": 2.5}', 400, "'max_tokens'"),
        ("/v1/chat/completions", b'{"messages": "hi"}', 400, "'messages'"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', 400, "messages[0].content"),
        ("/v1/completions", json.dumps({"prompt": "w " * 101}).encode(), 413, "at most 100"),
    ],
)
def test_bad_requests_name_the_field(path, body, status, fragment):
    with pytest.raises(BadRequest) as info:
        parse_inference_request(path, body, max_prompt_tokens=100)
    assert info.value.status == status and fragment in str(info.value)


def test_gateway_and_sidecar_derive_the_same_tokens_for_every_api():
    from prefixfleet.tokenizer import render_chat, tokenize

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    chat = parse_inference_request("/v1/chat/completions", json.dumps({"messages": msgs}).encode())
    assert chat.token_bytes == as_token_bytes(tokenize(render_chat(msgs)))
    gen = parse_inference_request("/generate", b'{"input_ids": [[5, 6], [7]], "stream": true}')
    assert (gen.token_bytes, gen.stream) == (as_token_bytes([5, 6]), True)
    comp = parse_inference_request("/v1/completions", b'{"prompt": ["a b", "c"], "cache_salt": "t1"}')
    assert (comp.num_tokens, comp.tenant_salt) == (2, "t1")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", b'{"text": "a b c", "cache_salt": "mine", "stream": true}'),
        ("/v1/completions", b'{"prompt": [[1, 2, 3]], "max_tokens": 4, "x": "\\ud800"}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "caf\xc3\xa9"}]}'),
    ],
)
def test_a_body_parsed_once_routes_as_the_salted_body_it_forwards(path, body):
    # the gateway's tenant path parses the body once: what it routes on must be what the sidecar
    # and engine will read from the re-encoded body it forwards (the tenant's salt, same tokens)
    obj = load_json_body(body)
    forwarded = salted_body(obj, "acme")
    routed = inference_request(path, obj)
    assert routed == parse_inference_request(path, forwarded)
    assert routed.tenant_salt == "acme"
    assert routed.token_bytes == parse_inference_request(path, body).token_bytes


def test_load_tracker_measures_prefill_rate_over_busy_periods_even_when_prefills_are_batched():
    t = LoadTracker(prefill_tokens_per_s=30000.0)
    a = t.admit(500, 0.0, timed=True)
    b = t.admit(500, 0.0, timed=True)
    assert (t.in_flight, t.queued, t.pending_prefill_tokens(0.1)) == (2, 2, 1000)
    # one batched prefill pass finishes both: 1000 tokens in 0.5 s of busy time = 2000 tok/s
    t.first_byte(a, 0.5)
    t.first_byte(b, 0.5001)
    assert t.queued == 0 and t.pending_prefill_tokens(0.6) == 0
    t.finish(a, 1.0)
    t.finish(b, 1.0)  # counted when done: the engine's usage report may correct the token count
    assert t.samples >= 1 and 2000 <= t.prefill_tokens_per_s < 30000
    for i in range(20):  # it converges on the engine's real rate
        h = t.admit(1000, 10.0 * i, timed=True)
        t.first_byte(h, 10.0 * i + 0.5)
        t.finish(h, 10.0 * i + 1.0)
    assert t.prefill_tokens_per_s == pytest.approx(2000, rel=0.01)
    assert (t.in_flight, t.pending_prefill_tokens(1000.0)) == (0, 0)


def test_the_engines_usage_report_beats_the_mirrors_prediction_for_rate_samples():
    t = LoadTracker(prefill_tokens_per_s=2000.0)
    for i in range(10):  # the mirror predicted misses, the engine had everything cached
        h = t.admit(1000, float(i), timed=True)
        t.first_byte(h, i + 0.05)
        t.report_uncached(h, 0)
        t.finish(h, i + 0.1)
    assert t.prefill_tokens_per_s == 2000.0  # no work done: no (wildly high) sample


def test_untimed_requests_count_as_pending_until_drained_at_the_measured_rate():
    t = LoadTracker(prefill_tokens_per_s=1000.0)
    t.admit(1000, 0.0, timed=False)
    assert t.pending_prefill_tokens(0.25) == 750
    assert t.pending_prefill_tokens(2.0) == 0 and t.queued == 1


def test_view_hashes_with_each_workers_identity():
    random.seed(1)
    view = FleetView(block_tokens=B)
    other = encode_record(MemberRecord(url="http://x:1", model="other", revision="r", block_tokens=8))
    view.apply_snapshot({"w1": _member(), "w2": other}, {"w1": _load(1), "w2": _load(1)}, now=0.0)
    hashes = view.request_hashes(as_token_bytes(list(range(16))), None, view.workers.values())
    assert set(hashes) == {(SEED, B), (CacheIdentity("other", "r").seed(), 8)}


@pytest.mark.parametrize(
    ("path", "events", "expected"),
    [
        ("/generate", [{"text": " a"}, {"text": " a b"}, {"text": " a b c"}], " a b c"),
        ("/v1/completions", [{"choices": [{"text": " a"}]}, {"choices": [{"text": " b"}]}], " a b"),
        (
            "/v1/chat/completions",
            [
                {"choices": [{"delta": {"role": "assistant", "content": "x"}}]},
                {"choices": [{"delta": {}}]},
                {"choices": [{"delta": {"content": " y"}}]},
            ],
            "x y",
        ),
    ],
)
def test_streamed_text_is_reassembled_across_arbitrary_chunk_boundaries(path, events, expected):
    from prefixfleet.router.proxying import StreamedText

    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    for cut in range(1, len(stream), 7):
        collector = StreamedText(path)
        for i in range(0, len(stream), cut):
            collector.feed(stream[i : i + cut])
        assert collector.text == expected


@settings(max_examples=80, deadline=None)
@given(
    token_seqs,
    st.lists(st.tuples(st.lists(st.integers(0, 5), max_size=30), st.floats(0, 60)), max_size=8),
    st.lists(st.integers(0, 5), max_size=30),
    st.floats(0, 100),
)
def test_matched_tokens_over_summary_and_overlay_equal_a_linear_walk(seqs, sends, query, now):
    """The binary search relies on summary ∪ overlay being prefix-closed; check it against a walk."""
    view = FleetView(block_tokens=B, overlay_ttl_s=30.0)
    w = view.add_static("http://w")
    w.summary = dataclasses.replace(_summary_of(_tree_with(seqs)), generated_at=0.0)  # overlay counts
    for tokens, t in sorted(sends, key=lambda s: s[1]):
        view.record_send(w.worker_id, block_hashes(tokens, SEED, B), 0, wall_now=t)
    chain = block_hashes(query, SEED, B)
    floor = max(now - 30.0, w.summary.generated_at - 1.0)
    walk = 0
    for h in chain:
        if not (w.summary.has_block(h) or w.overlay.get(h, float("-inf")) >= floor):
            break
        walk += 1
    assert view.matched_tokens(w, chain, B, wall_now=now) == walk * B
