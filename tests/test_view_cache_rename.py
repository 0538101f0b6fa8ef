"""A worker's cache renamed under the gateway's own sends (pure: FleetView fed records by hand).

A sidecar started without --model publishes its first summary under a placeholder identity, then
its engine names itself and the sidecar publishes its (still empty) mirror under the real name at
once (ff02227). A gateway that routed a request there under the placeholder hashed its overlay
under the old name; hashing the next request under the new name found nothing, so a burst on the
prefix went to another worker as a miss although the engine held it (seen under CPU load in
tests/test_dataplane_services.py's burst test: the first request answered by w0, the burst by w1).
"""

from __future__ import annotations

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.policies import RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.router.summary import encode_summary, make_summary
from prefixfleet.router.view import FleetView

B = 4
PLACEHOLDER = CacheIdentity("", "").seed()
ENGINE = CacheIdentity("emulated-llm", "main").seed()
PROMPT = as_token_bytes(list(range(40)))


def member() -> str:
    return encode_record(MemberRecord(url="http://127.0.0.1:9", model="", revision="", block_tokens=B))


def load(version: int) -> str:
    return encode_record(
        LoadReport(
            seq=version, ts=100.0, state="ready", engine_ok=True, in_flight=0, queued=0,
            pending_prefill_tokens=0, prefill_tokens_per_s=30000.0, cached_tokens=0,
            capacity_tokens=1000, summary_version=version,
        )
    )  # fmt: skip


def summary(worker: str, version: int, seed: int, generated_at: float, blocks: list[int]) -> bytes:
    return encode_summary(
        make_summary(
            worker=worker, version=version, generated_at=generated_at, block_tokens=B,
            identity_seed=seed, cached_tokens=len(blocks) * B, capacity_tokens=1000, blocks=blocks,
        )
    )  # fmt: skip


def placeholder_fleet() -> FleetView:
    """Two workers whose first summaries name the placeholder identity."""
    view = FleetView(block_tokens=B)
    view.apply_snapshot({"a": member(), "b": member()}, {"a": load(1), "b": load(1)}, 0.0)
    for wid in ("a", "b"):
        assert view.apply_summary(wid, summary(wid, 1, PLACEHOLDER, 99.0, [])) is None
    return view


def rows(view: FleetView, wall: float) -> dict[str, int]:
    workers = view.routable(0.0)
    hashes = view.request_hashes(PROMPT, None, workers)
    return {str(r.replica_id): r.matched_tokens for r in view.replica_states(workers, hashes, 40, wall)}


def send_the_prompt_to_a(view: FleetView, wall: float) -> None:
    chain = view.request_hashes(PROMPT, None, [view.workers["a"]])[view.cache_key(view.workers["a"])]
    assert view.cache_key(view.workers["a"]) == (PLACEHOLDER, B)
    view.record_send("a", chain, 40, wall)


def test_a_send_under_the_placeholder_name_still_matches_after_the_rename():
    view = placeholder_fleet()
    send_the_prompt_to_a(view, 100.0)
    # the engines name themselves: empty summaries under the real name, generated just after
    for wid in ("a", "b"):
        assert view.apply_summary(wid, summary(wid, 2, ENGINE, 100.1, [])) is None
    assert view.cache_key(view.workers["a"]) == (ENGINE, B)
    assert rows(view, 100.2) == {"a": 40, "b": 0}
    # so the default policy keeps the next request on the worker that holds the prefix
    workers = view.routable(0.0)
    states = view.replica_states(workers, view.request_hashes(PROMPT, None, workers), 40, 100.2)
    policy = make_policy("queue_aware")
    assert policy.choose(RouteRequest(tokens=PROMPT, num_tokens=40, now=100.2), states).replica_id == "a"


def test_the_next_send_is_recorded_under_the_new_name():
    view = placeholder_fleet()
    send_the_prompt_to_a(view, 100.0)
    assert view.apply_summary("a", summary("a", 2, ENGINE, 100.1, [])) is None
    w = view.workers["a"]
    chain = view.request_hashes(PROMPT, None, [w])[(ENGINE, B)]
    view.record_send("a", chain, 0, 100.2)
    assert list(w.overlay_keys) == [(PLACEHOLDER, B), (ENGINE, B)]
    assert view.matched_tokens(w, chain, B, 100.3) == 40


def test_a_summary_under_the_new_name_generated_well_after_the_send_ends_the_old_names_match():
    # by then the summary shows what the engine holds: here nothing (it evicted the prefix)
    view = placeholder_fleet()
    send_the_prompt_to_a(view, 100.0)
    assert view.apply_summary("a", summary("a", 3, ENGINE, 101.5, [])) is None
    assert rows(view, 101.6) == {"a": 0, "b": 0}
    view.prune_overlays(101.6)
    assert not view.workers["a"].overlay and not view.workers["a"].overlay_keys
