"""hot_subtrees and find_prefix on plain data: rates, counter resets, holders, ranking, reverse lookup."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.operator.hot_subtrees import (
    HotState,
    find_prefix,
    hot_subtrees,
    parse_subtree_id,
    subtree_id,
)
from prefixfleet.router.blockhash import CacheIdentity, block_hashes, salted_seed
from prefixfleet.router.radix import RadixTree, as_token_bytes, decode_tokens
from prefixfleet.router.summary import HotNode, build_summary, make_summary

HL = 10.0  # half-life used by these examples
KEEP_10S = 0.5  # what is left of a rate after one half-life


def summary(worker: str, hot: dict[int, tuple[int, int]], blocks: set[int] | None = None):
    """``hot``: hash -> (tokens, hits); every hot hash is also in the block set unless ``blocks`` says."""
    nodes = [HotNode(h, tokens, hits, 0.0) for h, (tokens, hits) in hot.items()]
    return make_summary(
        worker=worker,
        version=1,
        generated_at=0.0,
        block_tokens=16,
        identity_seed=0,
        cached_tokens=0,
        capacity_tokens=1000,
        blocks=set(hot) if blocks is None else blocks,
        hot=nodes,
    )


def by_id(observations):
    return {o.subtree_id: o for o in observations}


def test_first_observation_only_records_counters():
    subs, state = hot_subtrees({"a": summary("a", {1: (800, 50)})}, None, now=0.0, half_life_s=HL)
    assert subs == []
    assert state.hits[("a", 1)] == 50 and state.observed_s == 0.0


def test_rate_is_a_decayed_average_of_counter_increments_summed_over_workers():
    s0 = {"a": summary("a", {1: (800, 50)}), "b": summary("b", {1: (800, 10)})}
    _, state = hot_subtrees(s0, None, now=0.0, half_life_s=HL)
    # 10 s later: a served 60 more, b 40 more -> 10 requests/s through the node fleet-wide
    s1 = {"a": summary("a", {1: (800, 110)}), "b": summary("b", {1: (800, 50)})}
    subs, state = hot_subtrees(s1, state, now=10.0, half_life_s=HL)
    (only,) = subs
    assert only.subtree_id == subtree_id(1)
    assert only.rate_rps == pytest.approx((1 - KEEP_10S) * 10.0)
    assert only.tokens == 800 and only.holders == {"a", "b"}
    # steady for a long time: the decayed rate converges on the true rate
    for k in range(2, 12):
        a, b = 110 + 60 * (k - 1), 50 + 40 * (k - 1)
        s = {"a": summary("a", {1: (800, a)}), "b": summary("b", {1: (800, b)})}
        subs, state = hot_subtrees(s, state, now=10.0 * k, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx(10.0, rel=0.01)


def test_counter_reset_counts_the_new_value_not_a_negative_delta():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 500)})}, None, now=0.0, half_life_s=HL)
    # the node was evicted and cached again: its counter restarted and reached 20
    subs, _ = hot_subtrees({"a": summary("a", {1: (800, 20)})}, state, now=10.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx((1 - KEEP_10S) * 2.0)


def test_a_node_that_appears_later_counts_all_its_hits():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 5)})}, None, now=0.0, half_life_s=HL)
    subs, _ = hot_subtrees({"a": summary("a", {1: (800, 5), 2: (3000, 40)})}, state, now=10.0, half_life_s=HL)
    assert [s.subtree_id for s in subs] == [subtree_id(2)]  # node 1 saw no traffic: rate 0, dropped


def test_a_node_held_all_along_entering_the_top_k_counts_only_its_hits_after_that():
    # a reviewer's case: node 1 was cached on "a" all along (in its block set) but out of its top-K.
    # It enters with its lifetime counter, 1002, having gained 1 hit in the last 5 s; read as new
    # hits (delta = count) that was ~41 requests/s (15 s half-life).
    def fleet(hot: dict[int, tuple[int, int]]):
        return {"a": summary("a", hot, blocks={1, 2})}

    _, state = hot_subtrees(fleet({2: (800, 5000)}), None, now=0.0)
    _, state = hot_subtrees(fleet({2: (800, 5010)}), state, now=5.0)
    subs, state = hot_subtrees(fleet({2: (800, 5020), 1: (800, 1002)}), state, now=10.0)
    assert subtree_id(1) not in by_id(subs)  # no hit counted yet: below the minimum rate
    assert state.hits[("a", 1)] == 1002  # recorded: its growth counts from here
    subs, _ = hot_subtrees(fleet({2: (800, 5030), 1: (800, 1003)}), state, now=15.0)
    keep = 2 ** (-5.0 / 15.0)
    assert by_id(subs)[subtree_id(1)].rate_rps == pytest.approx((1 - keep) * 1 / 5.0)


def test_a_node_cached_since_the_last_round_counts_all_its_hits_even_after_an_eviction():
    # node 1 was ranked, then evicted (gone from the block set: its counter is forgotten), then
    # cached again and ranked with 30 hits: every one of them is since the last round
    _, state = hot_subtrees({"a": summary("a", {1: (800, 500)})}, None, now=0.0, half_life_s=HL)
    _, state = hot_subtrees({"a": summary("a", {}, blocks={7})}, state, now=10.0, half_life_s=HL)
    subs, _ = hot_subtrees({"a": summary("a", {1: (800, 30)})}, state, now=20.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx((1 - KEEP_10S) * 3.0)  # (the first round only recorded)


def test_a_worker_seen_for_the_first_time_has_its_counters_recorded_not_counted():
    # b joins the observed fleet with counters of unknown age (a pod whose first summary this is,
    # or one whose summary a caller forgot): only what they grow by from here counts
    _, state = hot_subtrees({"a": summary("a", {1: (800, 0)})}, None, now=0.0, half_life_s=HL)
    both = {"a": summary("a", {1: (800, 10)}), "b": summary("b", {1: (800, 7000)})}
    subs, state = hot_subtrees(both, state, now=10.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx((1 - KEEP_10S) * 1.0)  # a's 10 hits alone
    both = {"a": summary("a", {1: (800, 20)}), "b": summary("b", {1: (800, 7020)})}
    subs, _ = hot_subtrees(both, state, now=20.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx(KEEP_10S * (1 - KEEP_10S) * 1.0 + (1 - KEEP_10S) * 3.0)


def test_a_truncated_block_set_cannot_say_a_node_is_new():
    # a's last block set was capped: that it lacks node 1 does not mean a did not hold it
    capped = make_summary(
        worker="a", version=1, generated_at=0.0, block_tokens=16, identity_seed=0,
        cached_tokens=0, capacity_tokens=1000, blocks={2}, hot=[HotNode(2, 800, 0, 0.0)], truncated=True,
    )  # fmt: skip
    _, state = hot_subtrees({"a": capped}, None, now=0.0, half_life_s=HL)
    _, state = hot_subtrees({"a": capped}, state, now=10.0, half_life_s=HL)
    subs, _ = hot_subtrees({"a": summary("a", {1: (800, 900)})}, state, now=20.0, half_life_s=HL)
    assert subs == []


def test_idle_subtrees_decay_and_are_forgotten():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 0)})}, None, now=0.0, half_life_s=HL)
    subs, state = hot_subtrees({"a": summary("a", {1: (800, 100)})}, state, now=10.0, half_life_s=HL)
    hot_rate = subs[0].rate_rps
    subs, state = hot_subtrees({"a": summary("a", {1: (800, 100)})}, state, now=20.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx(hot_rate * KEEP_10S)
    for k in range(3, 30):
        subs, state = hot_subtrees({"a": summary("a", {})}, state, now=10.0 * k, half_life_s=HL)
    assert subs == [] and state.rates == {}


def test_node_leaving_a_workers_top_k_and_returning_is_not_double_counted():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 100)})}, None, now=0.0, half_life_s=HL)
    _, state = hot_subtrees({"a": summary("a", {}, blocks={1})}, state, now=10.0, half_life_s=HL)
    subs, _ = hot_subtrees({"a": summary("a", {1: (800, 120)})}, state, now=20.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx((1 - KEEP_10S) * 2.0)


def test_holders_come_from_block_sets_not_from_hot_lists():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 0)})}, None, now=0.0, half_life_s=HL)
    fleet = {
        "a": summary("a", {1: (800, 30)}),
        "b": summary("b", {}, blocks={1, 99}),  # holds it, does not rank it
        "c": summary("c", {}, blocks={99}),
    }
    subs, _ = hot_subtrees(fleet, state, now=10.0, half_life_s=HL)
    assert subs[0].holders == {"a", "b"}


def test_ranked_by_rate_times_tokens_and_limited():
    _, state = hot_subtrees({"a": summary("a", {1: (100, 0), 2: (5000, 0), 3: (1000, 0)})}, None, 0.0)
    subs, _ = hot_subtrees(
        {"a": summary("a", {1: (100, 400), 2: (5000, 20), 3: (1000, 50)})}, state, 10.0, limit=2
    )
    # values: 1 -> 40/s × 100 = 4000, 2 -> 2/s × 5000 = 10000, 3 -> 5/s × 1000 = 5000
    assert [s.subtree_id for s in subs] == [subtree_id(2), subtree_id(3)]


def test_departed_worker_is_forgotten():
    s0 = {"a": summary("a", {1: (800, 10)}), "b": summary("b", {1: (800, 10)})}
    _, state = hot_subtrees(s0, None, now=0.0)
    _, state = hot_subtrees({"a": summary("a", {1: (800, 20)})}, state, now=5.0)
    assert ("b", 1) not in state.hits


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="half_life_s"):
        hot_subtrees({}, None, 0.0, half_life_s=0)
    # int(x, 16) alone reads all of these; none is 16 hex digits
    for bad in ("xyz", "0x00000000000001", "+000000000000001", " 000000000000001", "0000_0000_000001"):
        with pytest.raises(ValueError, match="16 hex"):
            parse_subtree_id(bad)
    assert parse_subtree_id(subtree_id(2**64 - 1)) == 2**64 - 1
    assert isinstance(HotState(observed_s=math.pi).rates, dict)


def test_find_prefix_returns_the_tokens_a_published_hot_hash_names():
    seed = CacheIdentity("m").seed()
    tree = RadixTree(10_000)
    system = list(range(1000, 1100))  # 100 tokens
    for user in range(5):
        tree.insert(system + list(range(5000 + 50 * user, 5050 + 50 * user)))
    summary_, exports = build_summary(
        tree,
        worker="w",
        version=1,
        now=0.0,
        identity_seed=seed,
        block_tokens=16,
        namespace_seed=lambda ns: seed,
        wall_time_of=lambda tick: 0.0,
    )
    top = summary_.hot[0]
    assert top.hits == 5 and top.tokens == 96  # the shared system prompt, floored to whole blocks
    found = find_prefix(tree, top.hash, block_tokens=16, namespace_seed=lambda ns: seed)
    assert found is not None and found == exports[top.hash]
    assert found.token_bytes == as_token_bytes(system[:96])
    # any published block names a prefix, also one that ends inside a node's edge
    mid = block_hashes(system, seed, 16)[2]
    assert find_prefix(tree, mid, block_tokens=16, namespace_seed=lambda ns: seed).token_bytes == (
        as_token_bytes(system[:48])
    )
    assert find_prefix(tree, 12345, block_tokens=16, namespace_seed=lambda ns: seed) is None


def test_a_hash_listed_twice_keeps_its_larger_counter_and_longest_prefix():
    def twice(hits_1, hits_2, tokens_1=800, tokens_2=800):
        nodes = [HotNode(1, tokens_1, hits_1, 0.0), HotNode(1, tokens_2, hits_2, 0.0)]
        return make_summary(
            worker="a",
            version=1,
            generated_at=0.0,
            block_tokens=16,
            identity_seed=0,
            cached_tokens=0,
            capacity_tokens=1000,
            blocks={1},
            hot=nodes,
        )

    _, state = hot_subtrees({"a": twice(80, 50)}, None, now=0.0, half_life_s=HL)
    assert state.hits[("a", 1)] == 80
    # 20 more requests on the larger counter in 10 s: 2/s, half of it after one half-life
    subs, _ = hot_subtrees({"a": twice(100, 90, 900, 800)}, state, now=10.0, half_life_s=HL)
    assert subs[0].rate_rps == pytest.approx((1 - KEEP_10S) * 2.0)
    assert subs[0].tokens == 900


def test_workers_reporting_different_lengths_for_one_hash_keep_the_longest():
    _, state = hot_subtrees({"a": summary("a", {1: (900, 0)})}, None, now=0.0, half_life_s=HL)
    fleet = {"a": summary("a", {1: (900, 10)}), "b": summary("b", {1: (800, 10)})}
    subs, _ = hot_subtrees(fleet, state, now=10.0, half_life_s=HL)
    assert subs[0].tokens == 900


def test_a_subtree_out_of_every_top_k_keeps_decaying_with_its_last_known_length():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 0)})}, None, now=0.0, half_life_s=HL)
    subs, state = hot_subtrees({"a": summary("a", {1: (800, 100)})}, state, now=10.0, half_life_s=HL)
    rate = subs[0].rate_rps
    # still cached by "a" but no longer ranked: its rate fades instead of vanishing at once
    subs, _ = hot_subtrees({"a": summary("a", {}, blocks={1})}, state, now=20.0, half_life_s=HL)
    assert [(s.subtree_id, s.tokens, s.holders) for s in subs] == [(subtree_id(1), 800, {"a"})]
    assert subs[0].rate_rps == pytest.approx(rate * KEEP_10S)


def test_a_second_observation_at_the_same_instant_keeps_the_rates():
    _, state = hot_subtrees({"a": summary("a", {1: (800, 0)})}, None, now=0.0, half_life_s=HL)
    first, state = hot_subtrees({"a": summary("a", {1: (800, 100)})}, state, now=10.0, half_life_s=HL)
    again, _ = hot_subtrees({"a": summary("a", {1: (800, 100)})}, state, now=10.0, half_life_s=HL)
    assert again == first and first


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=12), st.sampled_from([None, "t"])),
        max_size=15,
    ),
    capacity=st.integers(12, 60),
)
def test_find_prefix_finds_every_published_block_as_the_cached_prefix_it_names(ops, capacity):
    base = CacheIdentity("m").seed()

    def ns_seed(ns):
        return salted_seed(base, ns)

    tree = RadixTree(capacity)
    for tokens, ns in ops:
        tree.insert(tokens, namespace=ns)  # evicts LRU leaves when full
    published, _ = build_summary(
        tree,
        worker="w",
        version=1,
        now=0.0,
        identity_seed=base,
        block_tokens=2,
        namespace_seed=ns_seed,
        wall_time_of=float,
    )
    for h in published.blocks:
        found = find_prefix(tree, h, block_tokens=2, namespace_seed=ns_seed)
        assert found is not None
        tokens = decode_tokens(found.token_bytes)
        assert len(tokens) % 2 == 0
        assert block_hashes(tokens, ns_seed(found.namespace), 2)[-1] == h
        assert tree.matched_tokens(tokens, namespace=found.namespace) == len(tokens)
