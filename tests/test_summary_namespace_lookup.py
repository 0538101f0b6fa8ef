"""The block index finds a new top node's namespace without listing the tree's namespaces.

Each cache salt (tenant) has its own root. When a prompt adds a node right under a root, the
summary's BlockIndex needs that root's namespace for the chain's seed. It used to scan every live
namespace for the one whose root it was: time linear in the live tenants on each such insert
(about a millisecond per request at 2000 tenants, on the sidecar's event loop). The tree keeps each
root's namespace; :meth:`RadixTree.namespace_of` looks it up, and the index uses that.

Behaviour is unchanged: the kept summary still equals a from-scratch walk (build_summary) across
many salts whose roots come and go as evictions empty them.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_summary_index import B, _same_summary  # the same 4-token blocks

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.mirror import CacheMirror
from prefixfleet.router.radix import RadixTree, as_token_bytes


def test_indexing_prompts_of_many_tenants_never_lists_the_namespaces() -> None:
    rng = random.Random(3)
    # room for ~300 prompts of 20 tokens: the 500 tenants' roots are dropped and made again
    mirror = CacheMirror(6000, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    tree = mirror.tree
    listings = 0
    listed = tree.namespaces

    def counted() -> list[object]:
        nonlocal listings
        listings += 1
        return listed()

    tree.namespaces = counted  # type: ignore[method-assign]
    for _ in range(2000):
        tenant = rng.randrange(500)
        salt = None if tenant == 0 else f"tenant-{tenant}"
        mirror.admit(as_token_bytes([rng.randrange(50) for _ in range(20)]), salt)
    assert tree.evictions_total > 0 and len(listed()) > 100
    assert listings == 0  # before: one scan of every live namespace per new top node
    del tree.namespaces
    _same_summary(mirror)


# Many salts over a small cache: namespaces are emptied (their root dropped) and come back.
prompts = st.lists(st.integers(0, 3), min_size=2, max_size=16)
salts = st.sampled_from([None, "", *(f"t{i}" for i in range(12))])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), prompts, salts),
        st.tuples(st.just("admit"), prompts, salts),
        st.tuples(st.just("admit"), prompts, salts),
        st.tuples(st.just("correct"), st.integers(1, 40)),
        st.tuples(st.just("summary")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=operations, capacity=st.integers(16, 80), max_blocks=st.integers(1, 24))
def test_the_kept_summary_equals_a_rebuild_across_many_salts(ops, capacity, max_blocks) -> None:
    mirror = CacheMirror(capacity, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    for op in [*ops, ("summary",)]:
        if op[0] == "admit":
            mirror.admit(as_token_bytes([10 + t for t in op[1]]), op[2])
        elif op[0] == "correct":
            mirror.correct(op[1], 0, ran_alone=True)
        else:
            _same_summary(mirror, max_blocks=max_blocks, hot_k=4)


def test_namespace_of_names_a_live_roots_namespace_only() -> None:
    tree = RadixTree(8)
    tree.insert([1, 2, 3, 4], None)
    tree.insert([1, 2, 3, 4], "a")
    unsalted, salted = tree.root(None), tree.root("a")
    assert tree.namespace_of(unsalted) is None
    assert tree.namespace_of(salted) == "a"
    with pytest.raises(KeyError):
        tree.namespace_of(next(iter(salted.children.values())))  # a node, no root
    tree.insert([5, 6, 7, 8], "b")  # evicts the least recent namespace's only node: its root goes
    assert None not in tree.namespaces()
    with pytest.raises(KeyError):
        tree.namespace_of(unsalted)
    tree.clear()
    with pytest.raises(KeyError):
        tree.namespace_of(salted)
