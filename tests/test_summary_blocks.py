"""What a published summary says about a worker's cache, checked against the tree by brute force.

A summary's block set is every full block of every cached sequence, chained per namespace from that
namespace's seed, so a gateway reading it estimates a prompt's cached prefix to the block: the
leading blocks it finds are exactly the whole blocks of the worker's real longest match.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity, block_hashes, salted_seed
from prefixfleet.router.radix import RadixTree
from prefixfleet.router.summary import build_summary, make_summary

B = 2
SEED = CacheIdentity("m", "r").seed()
NAMESPACES = [None, "tenant-a"]
prompts = st.lists(st.integers(0, 2), min_size=1, max_size=12)
inserts = st.lists(st.tuples(prompts, st.sampled_from(NAMESPACES)), max_size=20)


def namespace_seed(ns: object) -> int:
    return salted_seed(SEED, ns if isinstance(ns, str) else None)


def summarize(tree: RadixTree, max_blocks: int = 10_000):
    summary, _ = build_summary(
        tree,
        worker="w",
        version=1,
        now=0.0,
        identity_seed=SEED,
        block_tokens=B,
        namespace_seed=namespace_seed,
        wall_time_of=float,
        max_blocks=max_blocks,
    )
    return summary


def tree_of(ops: list[tuple[list[int], object]], capacity: int) -> RadixTree:
    tree = RadixTree(capacity)
    for tokens, ns in ops:
        if len(tokens) <= capacity:
            tree.insert(tokens, namespace=ns)  # evicts LRU leaves when full
    return tree


@settings(max_examples=100, deadline=None)
@given(ops=inserts, capacity=st.integers(12, 60))
def test_the_block_set_is_every_full_block_of_every_cached_sequence(ops, capacity):
    tree = tree_of(ops, capacity)
    expected = {
        h
        for ns in tree.namespaces()
        for seq in tree.cached_sequences(ns)
        for h in block_hashes(seq, namespace_seed(ns), B)
    }
    summary = summarize(tree)
    assert set(summary.blocks) == expected and not summary.truncated
    assert list(summary.blocks) == sorted(expected)  # sorted and distinct: has_block bisects
    assert (summary.cached_tokens, summary.capacity_tokens) == (tree.cached_tokens, capacity)


@settings(max_examples=100, deadline=None)
@given(ops=inserts, capacity=st.integers(12, 60), probe=prompts, ns=st.sampled_from(NAMESPACES))
def test_a_gateway_finds_exactly_the_whole_blocks_of_the_real_match(ops, capacity, probe, ns):
    tree = tree_of(ops, capacity)
    summary = summarize(tree)
    found = summary.matched_blocks(block_hashes(probe, namespace_seed(ns), B))
    assert found == tree.matched_tokens(probe, namespace=ns) // B


@settings(max_examples=100, deadline=None)
@given(ops=inserts, max_blocks=st.integers(1, 8))
def test_a_capped_block_set_keeps_only_whole_chains_from_their_start(ops, max_blocks):
    tree = tree_of(ops, 1_000)
    full = summarize(tree)
    capped = summarize(tree, max_blocks)
    assert capped.truncated == (len(full.blocks) > max_blocks)
    assert set(capped.blocks) <= set(full.blocks) and len(capped.blocks) <= max_blocks
    # closed under prefixes: a block is listed only with every block before it in its chain, so a
    # gateway never counts a block whose prefix the summary left out
    for ns in tree.namespaces():
        for seq in tree.cached_sequences(ns):
            chain = block_hashes(seq, namespace_seed(ns), B)
            listed = [capped.has_block(h) for h in chain]
            assert listed == sorted(listed, reverse=True), (seq, listed)


def test_matched_blocks_stops_at_the_first_absent_block():
    summary = make_summary(
        worker="w",
        version=1,
        generated_at=0.0,
        block_tokens=B,
        identity_seed=0,
        cached_tokens=0,
        capacity_tokens=10,
        blocks=[10, 30, 40],
    )
    assert summary.matched_blocks([10, 20, 30, 40]) == 1
    assert summary.matched_blocks([10, 30, 40]) == 3
    assert summary.matched_blocks([20, 10]) == 0
    assert (summary.has_block(30), summary.has_block(35), summary.has_block(99)) == (True, False, False)
