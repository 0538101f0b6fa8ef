"""The sglang_cache_aware policy's approximate tree against a brute-force model (hypothesis).

The model keeps, per worker ("tenant"), the set of token prefixes of everything routed to it with the
time each was last routed. The tree must agree: the same prefixes per tenant (until its LRU trim),
the same longest match over live tenants, the same most recent owner, and token counts per tenant
that are what the tree holds for it.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.radix import as_token_bytes, decode_tokens
from prefixfleet.router.tenant_tree import TenantTree

Seq = tuple[int, ...]
TENANTS = [0, 1, 2]
keys = st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), keys, st.sampled_from(TENANTS)),
        st.tuples(st.just("insert"), keys, st.sampled_from(TENANTS)),
        st.tuples(st.just("match"), keys, st.sets(st.sampled_from(TENANTS))),
        st.tuples(st.just("remove"), st.sampled_from(TENANTS)),
        st.tuples(st.just("trim"), st.integers(0, 10)),
    ),
    max_size=30,
)


def held(tree: TenantTree) -> dict[int, set[Seq]]:
    """Per tenant, every token prefix the tree says it holds (walking nodes and their edges)."""
    out: dict[int, set[Seq]] = {t: set() for t in TENANTS}
    stack = [((), c) for c in tree.root.children.values()]
    while stack:
        prefix, node = stack.pop()
        full = prefix + tuple(decode_tokens(node.edge))
        assert node.edge, "an empty edge below the root"
        for t in node.tenants:
            assert t in node.parent.tenants or node.parent is tree.root, "a tenant skips an ancestor"
            out[t] |= {full[:i] for i in range(len(prefix) + 1, len(full) + 1)}
        stack.extend((full, c) for c in node.children.values())
    return out


def lcp(a: Seq, b: Seq) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_the_tree_matches_a_per_tenant_prefix_model(ops):
    tree = TenantTree()
    model: dict[int, dict[Seq, float]] = {t: {} for t in TENANTS}  # prefix -> last routed time
    trimmed: set[int] = set()  # tenants whose LRU order the model does not follow
    clock = itertools.count(1)
    for op in ops:
        if op[0] == "insert":
            _, key, tenant = op
            now = float(next(clock))
            tree.insert(as_token_bytes(key), tenant, now)
            for i in range(1, len(key) + 1):
                model[tenant][key[:i]] = now
        elif op[0] == "remove":
            tree.remove_tenant(op[1])
            model[op[1]].clear()
            trimmed.discard(op[1])
        elif op[0] == "trim":
            before = held(tree)
            tree.evict_tenant_by_size(op[1])
            after = held(tree)
            for t in TENANTS:
                assert after[t] <= before[t]
                assert len(after[t]) <= max(op[1], 0) or not before[t]
                if after[t] != before[t]:
                    trimmed.add(t)
                    model[t] = {p: ts for p, ts in model[t].items() if p in after[t]}
        else:
            _, key, live = op
            sets = held(tree)
            best = max((lcp(key, p) for t in live for p in sets[t]), default=0)
            matched, owner = tree.prefix_match(as_token_bytes(key), live=set(live))
            assert matched == best
            if best:
                at = key[:best]
                holders = {t: model[t][at] for t in live if at in model[t]}
                assert owner in holders and holders[owner] == max(holders.values())
            else:
                assert owner is None
        sets = held(tree)
        for t in TENANTS:
            assert tree.tenant_tokens.get(t, 0) == len(sets[t])
            if t not in trimmed:
                assert sets[t] == set(model[t])


def test_the_owner_is_the_live_tenant_that_saw_the_prefix_last():
    tree = TenantTree()
    tree.insert(as_token_bytes([1, 2, 3]), "a", 1.0)
    tree.insert(as_token_bytes([1, 2, 9]), "b", 2.0)
    tree.insert(as_token_bytes([1, 2, 3, 4]), "c", 3.0)
    assert tree.prefix_match(as_token_bytes([1, 2, 3, 5])) == (3, "c")
    assert tree.prefix_match(as_token_bytes([1, 2, 3, 5]), live={"a", "b"}) == (3, "a")
    assert tree.prefix_match(as_token_bytes([1, 2, 7]), live={"a", "b"}) == (2, "b")
    assert tree.prefix_match(as_token_bytes([1, 2, 7]), live={"z"}) == (0, None)


def test_a_trim_drops_each_tenants_least_recently_routed_leaves_first():
    tree = TenantTree()
    tree.insert(as_token_bytes([1, 1, 1]), "a", 1.0)
    tree.insert(as_token_bytes([2, 2, 2]), "a", 2.0)
    tree.insert(as_token_bytes([1, 1, 1]), "b", 3.0)  # b's copy is newer, but a's is a's oldest
    tree.evict_tenant_by_size(3)
    assert tree.tenant_tokens == {"a": 3, "b": 3}
    assert tree.prefix_match(as_token_bytes([1, 1, 1]), live={"a"}) == (0, None)
    assert tree.prefix_match(as_token_bytes([2, 2, 2]), live={"a"}) == (3, "a")
    assert tree.prefix_match(as_token_bytes([1, 1, 1]), live={"b"}) == (3, "b")
