"""sglang_cache_aware's approximate tree keeps tenant salts apart and forgets departed workers whole.

The gateway salts block hashes per tenant (``cache_salt``), so for every hash-based policy tenant A's
prefixes never change where tenant B's requests go. The sglang_cache_aware port keeps its own tree
over raw tokens; it must key that tree by the request's namespace (the salt) too, or tenant B's
request follows tenant A's identical prefix to A's worker — visible to B in the answer's
``X-Prefixfleet-Worker`` header, i.e. B learns which prefixes A sends.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.policies import ReplicaState, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.tenant_tree import TenantTree

WORKERS = ("w0", "w1", "w2")


def _route(policy, tokens: list[int], salt: str | None, now: float, loads: dict[str, int]) -> str:
    request = RouteRequest(as_token_bytes(tokens), len(tokens), now=now, namespace=salt)
    rows = [ReplicaState(w, in_flight=loads[w]) for w in WORKERS]
    decision = policy.choose(request, rows)
    policy.on_routed(request, decision)
    return str(decision.replica_id)


def test_tenant_b_does_not_follow_tenant_a_s_identical_prefix():
    policy = make_policy("sglang_cache_aware")
    prefix = list(range(40))
    busy_first = {"w0": 3, "w1": 0, "w2": 1}  # w1 is least loaded: A's first request goes there
    assert _route(policy, [*prefix, 1], "tenant-a", 1.0, busy_first) == "w1"
    assert _route(policy, [*prefix, 2], "tenant-a", 2.0, {"w0": 0, "w1": 2, "w2": 1}) == "w1"
    # B's identical prefix: no match in B's namespace, so the least loaded (w0) wins, not A's w1
    assert _route(policy, [*prefix, 3], "tenant-b", 3.0, {"w0": 0, "w1": 2, "w2": 1}) == "w0"
    # while A itself still gets its cache hit, and unsalted requests stay in their own namespace
    assert _route(policy, [*prefix, 4], "tenant-a", 4.0, {"w0": 0, "w1": 2, "w2": 1}) == "w1"
    assert _route(policy, [*prefix, 5], None, 5.0, {"w0": 1, "w1": 2, "w2": 0}) == "w2"
    # an empty salt is no salt, as the block hashes have it: it shares the unsalted namespace
    assert _route(policy, [*prefix, 6], "", 6.0, {"w0": 0, "w1": 2, "w2": 1}) == "w2"


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.lists(st.integers(0, 50), min_size=8, max_size=40),
    a_loads=st.lists(st.fixed_dictionaries({w: st.integers(0, 5) for w in WORKERS}), min_size=1, max_size=5),
    b_loads=st.fixed_dictionaries({w: st.integers(0, 5) for w in WORKERS}),
)
def test_tenant_b_s_choice_is_the_same_whatever_prefix_tenant_a_sent(prefix, a_loads, b_loads):
    other = [t + 100 for t in prefix]  # same shape, no token in common
    choices = []
    for a_prefix in (prefix, other):
        policy = make_policy("sglang_cache_aware")
        for i, loads in enumerate(a_loads):
            _route(policy, [*a_prefix, 200 + i], "tenant-a", 1.0 + i, loads)
        choices.append(_route(policy, [*prefix, 300], "tenant-b", 20.0, b_loads))
    assert choices[0] == choices[1]


def _nodes(tree: TenantTree) -> int:
    stack = list(tree.roots.values())
    count = 0
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children.values())
    return count


def test_a_removed_worker_leaves_no_nodes_behind():
    """A worker that left used to leave its inner nodes behind, empty: the gateway's tree grew with
    every worker the fleet ever had."""
    tree = TenantTree()
    for i, tenant in enumerate(["a", "a", "b", "a"]):
        tree.insert(as_token_bytes([1, 2, 3 + i, 9]), tenant, float(i))
    tree.insert(as_token_bytes([7, 7]), "a", 5.0)
    tree.remove_tenant("a")
    # only b's path [1, 2, 5, 9] is left: the shared [1, 2] node and b's own leaf, under the root
    assert _nodes(tree) == 3
    assert tree.prefix_match(as_token_bytes([1, 2, 3, 9])) == (2, "b")
    tree.remove_tenant("b")
    assert _nodes(tree) == 1 and tree.tenant_tokens == {}


def test_a_removed_worker_leaves_no_namespace_behind():
    tree = TenantTree()
    tree.insert(as_token_bytes([1, 2, 3]), "a", 1.0, "s1")
    tree.insert(as_token_bytes([1, 2, 3]), "b", 2.0, "s2")
    tree.remove_tenant("a")
    assert set(tree.roots) == {None, "s2"} and _nodes(tree) == 3
    assert tree.prefix_match(as_token_bytes([1, 2, 3]), {"a", "b"}, "s2") == (3, "b")


def test_trimming_counts_a_worker_over_every_namespace_and_drops_emptied_namespaces():
    tree = TenantTree()
    tree.insert(as_token_bytes([1, 1, 1]), "a", 1.0, "s1")
    tree.insert(as_token_bytes([2, 2, 2]), "a", 2.0, None)
    assert tree.tenant_tokens == {"a": 6}
    tree.evict_tenant_by_size(3)  # a holds 6 tokens over two namespaces: its oldest leaf goes
    assert tree.tenant_tokens == {"a": 3}
    assert set(tree.roots) == {None}
    assert tree.prefix_match(as_token_bytes([2, 2, 2]), {"a"}) == (3, "a")
    assert tree.prefix_match(as_token_bytes([1, 1, 1]), {"a"}, "s1") == (0, None)
