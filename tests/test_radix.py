"""Specification of the prefix index (prefixfleet.router.radix.RadixTree) by example."""

from __future__ import annotations

import random
from array import array

import pytest

from prefixfleet.router.radix import (
    CacheFullError,
    PinError,
    RadixNode,
    RadixTree,
    as_token_bytes,
    decode_tokens,
)


def all_nodes(tree: RadixTree) -> list[RadixNode]:
    return [node for ns in tree.namespaces() for _, node in tree.iter_nodes(ns)]


# -- construction and encoding --------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -5, 2.5, "100", None])
def test_capacity_must_be_a_positive_integer(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity_tokens"):
        RadixTree(capacity)  # type: ignore[arg-type]


def test_tokens_are_little_endian_uint32_and_round_trip() -> None:
    assert as_token_bytes([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert as_token_bytes(array("I", [7, 2**32 - 1])) == as_token_bytes([7, 2**32 - 1])
    assert decode_tokens(as_token_bytes([5, 0, 2**32 - 1])) == [5, 0, 2**32 - 1]


@pytest.mark.parametrize("bad", [[-1], [2**32], ["a"], [1.5]])
def test_out_of_range_or_non_integer_tokens_are_refused(bad: list[object]) -> None:
    tree = RadixTree(16)
    with pytest.raises(ValueError, match="token"):
        tree.insert(bad)  # type: ignore[arg-type]
    assert tree.cached_tokens == 0


def test_encoded_bytes_must_be_whole_tokens() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        as_token_bytes(b"\x01\x02\x03")


# -- insert and match ------------------------------------------------------------------------


def test_first_insert_reports_all_tokens_new() -> None:
    tree = RadixTree(32)
    result = tree.insert([1, 2, 3, 4, 5, 6])
    assert (result.matched_tokens, result.new_tokens, result.cached_tokens) == (0, 6, 6)
    assert result.evicted_tokens == 0
    assert tree.node_count == 1


def test_divergent_insert_splits_the_shared_edge() -> None:
    tree = RadixTree(32)
    tree.insert([1, 2, 3, 4, 5, 6])
    second = tree.insert([1, 2, 3, 4, 9, 10])
    assert (second.matched_tokens, second.new_tokens, second.cached_tokens) == (4, 2, 8)
    # one shared node [1..4] with two leaves [5, 6] and [9, 10]
    assert tree.node_count == 3
    assert sorted(tree.cached_sequences()) == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 10]]
    assert tree.matched_tokens([1, 2, 3, 4, 5, 6]) == 6
    assert tree.matched_tokens([1, 2, 3, 4, 9, 10, 11]) == 6


def test_reinserting_a_cached_sequence_adds_nothing() -> None:
    tree = RadixTree(32)
    tree.insert([1, 2, 3])
    again = tree.insert([1, 2, 3])
    assert (again.matched_tokens, again.new_tokens, again.cached_tokens) == (3, 0, 3)
    assert tree.node_count == 1


def test_a_match_may_end_inside_an_edge() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4])
    match = tree.match_prefix([1, 2, 3])
    assert match.matched_tokens == 3
    assert match.depth_in_node == 3 and match.node.num_tokens == 4
    assert tree.matched_tokens([1, 2, 3, 9]) == 3
    assert tree.node_count == 1  # matching never splits


def test_inserting_a_prefix_of_a_cached_edge_adds_no_tokens() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4])
    result = tree.insert([1, 2])
    assert (result.matched_tokens, result.new_tokens) == (2, 0)
    assert tree.cached_sequences() == [[1, 2, 3, 4]]


def test_no_match_and_empty_tree() -> None:
    tree = RadixTree(10)
    assert tree.matched_tokens([1, 2]) == 0
    assert tree.match_prefix([1, 2]).matched_tokens == 0
    tree.insert([1, 2])
    assert tree.matched_tokens([3, 1, 2]) == 0
    assert [1, 2] in tree and [1] in tree and [1, 2, 3] not in tree


def test_accepts_arrays_and_encoded_bytes_as_the_same_tokens() -> None:
    tree = RadixTree(10)
    tree.insert(array("I", [4, 5, 6]))
    assert tree.matched_tokens(as_token_bytes([4, 5, 6, 7])) == 3
    assert tree.matched_tokens((4, 5)) == 2


# -- capacity and LRU eviction ----------------------------------------------------------------


def test_lru_evicts_the_oldest_unpinned_leaf_first() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4])
    tree.insert([5, 6, 7, 8])
    tree.insert([9, 10, 11, 12])  # needs 2 more tokens: the oldest leaf [1..4] goes
    assert tree.matched_tokens([1, 2, 3, 4]) == 0
    assert tree.matched_tokens([5, 6, 7, 8]) == 4
    assert tree.cached_tokens == 8


def test_a_match_refreshes_recency() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4])
    tree.insert([5, 6, 7, 8])
    assert tree.match_prefix([1, 2, 3, 4]).matched_tokens == 4  # now [5..8] is the oldest
    result = tree.insert([9, 10, 11, 12])
    assert result.evicted_tokens == 4
    assert tree.matched_tokens([1, 2, 3, 4]) == 4
    assert tree.matched_tokens([5, 6, 7, 8]) == 0


def test_a_probe_without_touch_leaves_recency_alone() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4])
    tree.insert([5, 6, 7, 8])
    tree.match_prefix([1, 2, 3, 4], touch=False)
    tree.matched_tokens([1, 2, 3, 4])
    tree.insert([9, 10, 11, 12])
    assert tree.matched_tokens([1, 2, 3, 4]) == 0
    assert tree.matched_tokens([5, 6, 7, 8]) == 4


def test_a_match_ending_inside_an_edge_refreshes_that_leaf() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4])
    tree.insert([5, 6, 7, 8])
    tree.match_prefix([1, 2])
    tree.insert([9, 10, 11, 12])
    assert tree.matched_tokens([1, 2, 3, 4]) == 4
    assert tree.matched_tokens([5, 6, 7, 8]) == 0


def test_eviction_frees_whole_leaves_and_then_their_parents() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3, 4, 5])
    tree.insert([1, 2, 3, 9])  # [1,2,3] -> {[4,5], [9]}
    tree.insert([7, 7, 7])  # full: 3 + 2 + 1 + 3 = 9 > 8, so [4, 5] (oldest leaf) goes
    assert sorted(tree.cached_sequences()) == [[1, 2, 3, 9], [7, 7, 7]]
    tree.insert([8, 8, 8, 8, 8])  # needs 5 more: leaf [9] then its now-leaf parent [1,2,3]
    assert sorted(tree.cached_sequences()) == [[7, 7, 7], [8, 8, 8, 8, 8]]
    assert tree.cached_tokens == 8
    assert tree.evicted_tokens_total == 2 + 1 + 3
    assert tree.evictions_total == 3


def test_extending_a_prefix_never_evicts_its_own_ancestor() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4, 5, 6])  # the oldest leaf, and the path being extended
    tree.insert([20, 21, 22, 23])
    result = tree.insert([1, 2, 3, 4, 5, 6, 7, 8])
    assert result.matched_tokens == 6
    assert tree.matched_tokens([1, 2, 3, 4, 5, 6, 7, 8]) == 8
    assert tree.matched_tokens([20, 21, 22, 23]) == 0
    assert tree.cached_tokens <= 10


def test_extending_from_inside_an_edge_keeps_the_matched_part() -> None:
    tree = RadixTree(7)
    tree.insert([1, 2, 3, 4, 5, 6])
    tree.insert([1, 2, 3, 9, 9])  # 6 + 2 > 7: the unmatched tail [4,5,6] of the old leaf goes
    assert tree.cached_sequences() == [[1, 2, 3, 9, 9]]
    assert tree.cached_tokens == 5


def test_explicit_evict_frees_at_least_the_asked_tokens() -> None:
    tree = RadixTree(100)
    tree.insert([1, 2, 3])
    tree.insert([4, 5])
    assert tree.evict(1) == 3  # whole leaves only
    assert tree.cached_sequences() == [[4, 5]]
    with pytest.raises(CacheFullError):
        tree.evict(3)
    assert tree.cached_sequences() == [[4, 5]]


def test_an_oversized_sequence_is_refused_before_any_change() -> None:
    tree = RadixTree(6)
    tree.insert([1, 2, 3, 4])
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        tree.insert([1, 2, 3, 4, 5, 6, 7])
    assert tree.matched_tokens([1, 2, 3, 4]) == 4
    assert tree.cached_sequences() == [[1, 2, 3, 4]]
    assert tree.node_count == 1 and tree.cached_tokens == 4


# -- pins -------------------------------------------------------------------------------------


def test_pinned_data_is_never_evicted_and_a_blocked_insert_raises() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3, 4, 5, 6], pin=True)
    with pytest.raises(CacheFullError):
        tree.insert([10, 11, 12, 13])
    assert tree.matched_tokens([1, 2, 3, 4, 5, 6]) == 6
    assert tree.cached_tokens == 6 and tree.pinned_tokens == 6


def test_a_failed_insert_leaves_every_branch_and_count_intact() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4, 5, 6], pin=True)
    tree.insert([20, 21, 22, 23], pin=True)
    before = (
        sorted(tree.cached_sequences()),
        tree.cached_tokens,
        tree.pinned_tokens,
        tree.node_count,
        tree.namespaces(),
    )
    # diverges inside the pinned edge: would need a split, and room that is all pinned
    with pytest.raises(CacheFullError):
        tree.insert([1, 2, 3, 4, 9, 10, 11, 12])
    with pytest.raises(CacheFullError):
        tree.insert([30, 31], namespace="tenant-b")
    after = (
        sorted(tree.cached_sequences()),
        tree.cached_tokens,
        tree.pinned_tokens,
        tree.node_count,
        tree.namespaces(),
    )
    assert after == before
    assert tree.matched_tokens([1, 2, 3, 4, 5, 6]) == 6
    assert tree.matched_tokens([20, 21, 22, 23]) == 4
    assert tree.cached_tokens == 10


def test_a_released_pin_becomes_evictable() -> None:
    tree = RadixTree(6)
    tree.insert([1, 2, 3, 4], pin=True)
    tree.release_pin([1, 2, 3, 4])
    assert tree.pinned_tokens == 0
    tree.insert([5, 6, 7, 8])
    assert tree.matched_tokens([1, 2, 3, 4]) == 0
    assert tree.matched_tokens([5, 6, 7, 8]) == 4


def test_releasing_a_pin_not_held_raises() -> None:
    tree = RadixTree(6)
    tree.insert([1, 2, 3])
    with pytest.raises(PinError, match="no pin"):
        tree.release_pin([1, 2, 3])
    assert issubclass(PinError, ValueError)


def test_pins_are_counted_and_each_needs_a_release() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3], pin=True)
    tree.insert([1, 2, 3], pin=True)
    tree.release_pin([1, 2, 3])
    with pytest.raises(CacheFullError):
        tree.insert([9, 9, 9, 9, 9, 9])  # still pinned once
    tree.release_pin([1, 2, 3])
    with pytest.raises(PinError):
        tree.release_pin([1, 2, 3])
    tree.insert([9, 9, 9, 9, 9, 9])
    assert tree.cached_sequences() == [[9, 9, 9, 9, 9, 9]]


def test_pinning_a_prefix_inside_an_edge_pins_only_that_prefix() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3, 4, 5, 6])
    tree.insert([1, 2, 3], pin=True)  # splits so the pin covers exactly [1, 2, 3]
    assert tree.pinned_tokens == 3 and tree.node_count == 2
    tree.insert([7, 7, 7, 7, 7])  # the unpinned tail [4, 5, 6] goes, the pinned head stays
    assert sorted(tree.cached_sequences()) == [[1, 2, 3], [7, 7, 7, 7, 7]]
    assert tree.pinned_sequences() == {(None, as_token_bytes([1, 2, 3])): 1}


def test_clear_drops_everything_including_pins() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3], pin=True)
    tree.clear()
    assert (tree.cached_tokens, tree.pinned_tokens, tree.node_count) == (0, 0, 0)
    assert tree.pinned_sequences() == {}
    with pytest.raises(PinError):
        tree.release_pin([1, 2, 3])


# -- namespaces -------------------------------------------------------------------------------


def test_identical_tokens_in_different_namespaces_never_share_nodes() -> None:
    tree = RadixTree(100)
    tree.insert([1, 2, 3, 4], namespace="tenant-a")
    first_b = tree.insert([1, 2, 3, 4], namespace="tenant-b")
    assert first_b.matched_tokens == 0 and first_b.new_tokens == 4
    assert tree.cached_tokens == 8 and tree.node_count == 2
    nodes_a = {id(n) for _, n in tree.iter_nodes("tenant-a")}
    nodes_b = {id(n) for _, n in tree.iter_nodes("tenant-b")}
    assert nodes_a and nodes_b and not nodes_a & nodes_b
    assert tree.matched_tokens([1, 2, 3, 4], namespace="tenant-c") == 0
    assert tree.matched_tokens([1, 2, 3, 4]) == 0  # the default namespace is separate too
    assert set(tree.namespaces()) == {"tenant-a", "tenant-b"}


def test_namespaces_share_capacity_and_lru() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3, 4], namespace="a")
    tree.insert([1, 2, 3, 4], namespace="b")
    tree.insert([5, 5], namespace="c")  # the oldest leaf overall (namespace "a") goes
    assert tree.matched_tokens([1, 2, 3, 4], namespace="a") == 0
    assert tree.matched_tokens([1, 2, 3, 4], namespace="b") == 4


def test_pins_are_per_namespace() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2], namespace="a", pin=True)
    tree.insert([1, 2], namespace="b")
    with pytest.raises(PinError):
        tree.release_pin([1, 2], namespace="b")
    tree.release_pin([1, 2], namespace="a")
    assert tree.pinned_tokens == 0


# -- eviction cost and the lazy heap ------------------------------------------------------------


def test_heap_compaction_during_a_cascading_eviction_keeps_lru_order() -> None:
    """Regression: ``_evict`` kept popping a heap list that a parent push had just compacted away.

    A chain whose nodes become leaves one after another, next to one leaf with many stale heap
    entries, drives the heap over its compaction threshold in the middle of the eviction. Before
    the fix the newest leaf was evicted out of LRU order and CacheFullError was raised.
    """
    for length in (10, 50):
        for touches in range(0, 300, 3):  # sweeps the compaction threshold across the eviction
            tree = RadixTree(10_000)
            chain = list(range(length))
            for k in range(1, length + 1):
                tree.insert(chain[:k])  # one-token nodes in a chain, all older than [1000]
            tree.insert([1000])
            for _ in range(touches):
                tree.match_prefix([1000])  # stale heap entries for one leaf
            assert tree.evict(length) == length, (length, touches)
            assert tree.cached_sequences() == [[1000]], (length, touches)
            assert tree.node_count == 1 and tree.cached_tokens == 1


def test_evicting_one_leaf_of_a_20k_leaf_tree_pops_one_heap_entry() -> None:
    tree = RadixTree(1_000_000)
    for i in range(20_000):
        tree.insert([i, i + 1, i + 2])
    heap_before = len(tree._heap)
    assert heap_before == 20_000  # one entry per leaf, no scan needed to find the oldest
    assert tree.evict(1) == 3
    assert len(tree._heap) == heap_before - 1
    assert tree.matched_tokens([0, 1, 2]) == 0 and tree.node_count == 19_999


def test_the_heap_stays_bounded_by_the_node_count_under_many_touches() -> None:
    rng = random.Random(7)
    tree = RadixTree(1_000_000)
    for i in range(2_000):
        tree.insert([i % 50, i, i])
    bound = 4 * tree.node_count + 64 + 1
    for _ in range(40_000):
        i = rng.randrange(2_000)
        tree.match_prefix([i % 50, i, i])
        assert len(tree._heap) <= bound
    # and compaction never loses a live leaf: evicting everything unpinned still works
    total = tree.cached_tokens
    assert total == 50 + 2_000 * 2
    assert tree.evict(total) == total
    assert tree.node_count == 0 and not tree.cached_sequences()


def test_the_heap_stays_bounded_after_an_eviction_shrinks_the_tree() -> None:
    """Regression (found by the stateful test): eviction lowers node_count without a push, so the
    stale entries that many touches left behind outnumbered the tree until the next insert."""
    tree = RadixTree(1_000)
    for leaf in range(3):
        tree.insert([leaf])
    for _ in range(70):  # stale entries, up to the push-side threshold of 4 × 3 + 64
        tree.match_prefix([0])
    tree.evict(2)
    assert tree.node_count == 1
    assert len(tree._heap) <= 4 * tree.node_count + 64


# -- taking back an insert ------------------------------------------------------------------------


def _inserted_leaf(tree: RadixTree, tokens: list[int]) -> tuple[RadixNode, int]:
    """Insert ``tokens``; return the leaf the insert added and its stamp (as a caller records them)."""
    assert tree.insert(tokens).new_tokens
    leaf = tree.match_prefix(tokens, touch=False).node
    return leaf, leaf.last_access


def test_an_untouched_leaf_is_removed_and_counted_as_an_eviction() -> None:
    tree = RadixTree(100)
    tree.insert([1, 2, 3])
    leaf, stamp = _inserted_leaf(tree, [1, 2, 3, 4, 5])
    assert tree.remove_leaf(leaf, if_untouched_since=stamp) == 2
    assert tree.cached_sequences() == [[1, 2, 3]] and (tree.cached_tokens, tree.node_count) == (3, 1)
    assert (tree.evictions_total, tree.evicted_tokens_total) == (1, 2)
    assert leaf.parent is None  # detached like an evicted node, which is how followers find it
    assert tree.evict(3) == 3  # the parent, a leaf again, is evictable
    assert tree.remove_leaf(leaf, if_untouched_since=stamp) == 0  # once


def test_a_split_leaf_gives_back_only_its_lower_part_and_the_parent_is_not_merged() -> None:
    tree = RadixTree(100)
    leaf, stamp = _inserted_leaf(tree, [1, 2, 3, 4])
    tree.insert([1, 2, 9])  # splits the leaf after [1, 2]; the leaf node keeps [3, 4]
    assert tree.remove_leaf(leaf, if_untouched_since=stamp) == 2
    assert sorted(tree.cached_sequences()) == [[1, 2, 9]]
    assert tree.node_count == 2  # [1, 2] keeps its one child, as after an eviction


def test_a_leaf_used_or_gone_since_its_insert_stays() -> None:
    tree = RadixTree(100)

    def state() -> tuple[object, ...]:
        return sorted(tree.cached_sequences()), tree.cached_tokens, tree.node_count, tree.evictions_total

    touched = _inserted_leaf(tree, [1, 1])
    tree.match_prefix([1])  # a match reaching into it
    extended = _inserted_leaf(tree, [2, 2])
    tree.insert([2, 2, 2])
    pinned = _inserted_leaf(tree, [3, 3])
    tree.insert([3, 3], pin=True)
    before = state()
    for leaf, stamp in (touched, extended, pinned):
        assert tree.remove_leaf(leaf, if_untouched_since=stamp) == 0
    assert state() == before
    evicted = _inserted_leaf(tree, [4, 4])
    tree.evict(tree.cached_tokens - tree.pinned_tokens)
    before = state()
    assert tree.remove_leaf(evicted[0], if_untouched_since=evicted[1]) == 0
    assert state() == before
    flushed = _inserted_leaf(tree, [5, 5])
    tree.clear()
    tree.insert([5, 5])
    assert tree.remove_leaf(flushed[0], if_untouched_since=flushed[1]) == 0  # from before the clear
    assert tree.cached_sequences() == [[5, 5]]


def test_the_heap_stays_bounded_after_removing_leaves() -> None:
    tree = RadixTree(1_000)
    leaves = [_inserted_leaf(tree, [leaf]) for leaf in range(3)]
    for _ in range(70):  # stale entries, up to the push-side threshold of 4 × 3 + 64
        tree.match_prefix([0])
    for leaf, stamp in leaves[1:]:
        assert tree.remove_leaf(leaf, if_untouched_since=stamp) == 1
    assert tree.node_count == 1
    assert len(tree._heap) <= 4 * tree.node_count + 64


def test_memory_estimate_grows_with_the_tree() -> None:
    tree = RadixTree(100_000)
    empty = tree.memory_bytes()
    for i in range(100):
        tree.insert([i] * 100)
    assert tree.memory_bytes() > empty + 100 * 100 * 4


def test_diverging_inside_an_edge_cannot_make_room_by_evicting_the_matched_part() -> None:
    tree = RadixTree(9)
    tree.insert([7, 7], pin=True)
    tree.insert([1, 2, 3, 4, 5, 6])
    # matches [1, 2, 3, 4] inside the edge and needs 3 more tokens of room: [7, 7] is pinned and the
    # matched part is the path being extended, so only the tail [5, 6] could go: refused, unchanged
    with pytest.raises(CacheFullError):
        tree.insert([1, 2, 3, 4, 9, 9, 9, 9])
    assert sorted(tree.cached_sequences()) == [[1, 2, 3, 4, 5, 6], [7, 7]]
    assert (tree.cached_tokens, tree.node_count, tree.evictions_total) == (8, 2, 0)
