"""A namespace (tenant salt) whose last cached node goes takes its root with it.

Each ``cache_salt`` gets its own root in the radix tree (the sidecar's mirror, the emulator's
cache). A root stayed when everything under it was evicted, so every salt ever seen kept one: a
client salting each request (or a fleet with many tenants over time) made the namespace list grow
without bound, and the summary's block index, which finds a new top node's namespace by scanning
that list, spent time linear in every salt ever seen on each such insert (8000 salts: 23 s of
inserts into a 2000-token mirror instead of 0.2 s). Now the namespaces are those holding tokens.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.mirror import CacheMirror
from prefixfleet.router.radix import RadixTree, as_token_bytes
from prefixfleet.router.summary import build_summary


def test_salting_every_request_keeps_only_the_namespaces_that_hold_tokens() -> None:
    mirror = CacheMirror(2000, CacheIdentity("m", "r"), block_tokens=16, clock=time.time)
    prompt = as_token_bytes(range(100))
    for i in range(3000):
        sent = mirror.admit_sent(prompt, f"salt-{i}")
        if i % 7 == 0:
            mirror.withdraw(sent)  # a request that ended before its first token
    tree = mirror.tree
    live = {ns for ns in tree.namespaces() if tree.root(ns).children}
    assert set(tree.namespaces()) == live
    assert len(live) <= tree.node_count <= 20


def test_a_namespace_emptied_by_the_insert_that_reuses_it_keeps_the_new_prompt() -> None:
    tree = RadixTree(10)
    tree.insert([1, 2, 3, 4, 5, 6], "a")
    tree.insert([7, 8, 9, 10, 11, 12], "a")  # evicts 1..6, the only other node of "a"
    assert tree.namespaces() == ["a"]
    assert tree.cached_sequences("a") == [[7, 8, 9, 10, 11, 12]]
    assert tree.match_prefix([7, 8, 9], "a").matched_tokens == 3


sends = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=20), st.sampled_from([None, "a", "b", "c"])),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(sends=sends, capacity=st.integers(4, 60))
def test_namespaces_are_exactly_those_holding_tokens_and_the_summary_still_matches(sends, capacity) -> None:
    mirror = CacheMirror(capacity, CacheIdentity("m", "r"), block_tokens=4, clock=lambda: 0.0)
    for tokens, namespace in sends:
        mirror.admit_sent(as_token_bytes(tokens), namespace)
        tree = mirror.tree
        assert {ns for ns in tree.namespaces() if tree.root(ns).children} == set(tree.namespaces())
        kept = mirror.summary(worker="w", version=1, max_blocks=16, hot_k=4)
        fresh, _ = build_summary(
            tree, worker="w", version=1, now=0.0, identity_seed=mirror.identity_seed, block_tokens=4,
            namespace_seed=mirror.namespace_seed, wall_time_of=mirror.wall_time_of, max_blocks=16, hot_k=4,
        )  # fmt: skip
        assert kept == fresh
