"""Property-based specification of RadixTree against a brute-force reference model.

The model keeps the cache as a plain set of token-level prefixes, one per cached token, with its own
recency clock and pin counts, and evicts by scanning every leaf and taking the least recently used
one (no heap). The tree must agree with it exactly after every operation: same cached sequences,
same longest matches, same refusals, same victims, the same leaves taken back (``remove_leaf``).
Only node *boundaries* (where edges split) are read from the tree, because eviction frees whole
edges.

Tokens come from a four-letter alphabet and sequences are short, so shared prefixes, splits inside
edges and evictions are common.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from prefixfleet.router.radix import (
    TOKEN_BYTES,
    CacheFullError,
    PinError,
    RadixNode,
    RadixTree,
    decode_tokens,
)

pytestmark = pytest.mark.slow

Seq = tuple[int, ...]
Key = tuple[object, Seq]  # (namespace, token prefix)

NAMESPACES = [None, "tenant-b"]
tokens = st.integers(min_value=0, max_value=3)
sequences = st.lists(tokens, min_size=1, max_size=7).map(tuple)
namespaces = st.sampled_from(NAMESPACES)


# -- reading the tree -----------------------------------------------------------------------


def walk(tree: RadixTree) -> list[tuple[object, int, Seq, RadixNode]]:
    """Every node as (namespace, start, full prefix at its end, node), by explicit DFS."""
    out: list[tuple[object, int, Seq, RadixNode]] = []
    for ns in tree.namespaces():
        stack: list[tuple[Seq, RadixNode]] = [((), c) for c in tree.root(ns).children.values()]
        while stack:
            prefix, node = stack.pop()
            full = prefix + tuple(decode_tokens(node.edge))
            out.append((ns, len(prefix), full, node))
            stack.extend((full, c) for c in node.children.values())
    return out


def cached_prefixes(tree: RadixTree) -> set[Key]:
    """Brute force from the public listing: every prefix of every cached sequence."""
    return {
        (ns, tuple(seq[:i]))
        for ns in tree.namespaces()
        for seq in tree.cached_sequences(ns)
        for i in range(1, len(seq) + 1)
    }


def longest_cached_prefix(tree: RadixTree, seq: Seq, ns: object) -> int:
    """Brute force: the longest common prefix of ``seq`` with any cached sequence."""
    best = 0
    for cached in tree.cached_sequences(ns) if ns in tree.namespaces() else []:
        n = 0
        while n < min(len(cached), len(seq)) and cached[n] == seq[n]:
            n += 1
        best = max(best, n)
    return best


def snapshot(tree: RadixTree) -> tuple[object, ...]:
    return (
        sorted((repr(ns), sorted(tree.cached_sequences(ns))) for ns in tree.namespaces()),
        tree.cached_tokens,
        tree.pinned_tokens,
        tree.node_count,
        tree.pinned_sequences(),
    )


# -- the reference model ------------------------------------------------------------------


class ReferenceCache:
    """Token-level LRU cache model: a set of prefixes with stamps, pins as a counter."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stamps: dict[Key, int] = {}  # one entry per cached token, i.e. the cached prefix set
        self.pins: Counter[Key] = Counter()
        self.clock = 0
        # requests that went through each cached token since it was (last) cached
        self.hits: dict[Key, int] = {}

    def pinned_prefixes(self) -> set[Key]:
        return {(ns, seq[:i]) for (ns, seq) in self.pins for i in range(1, len(seq) + 1)}

    def matched(self, seq: Seq, ns: object) -> int:
        n = 0
        while n < len(seq) and (ns, seq[: n + 1]) in self.stamps:
            n += 1
        return n

    def touch(self, keys: list[Key]) -> None:
        self.clock += 1
        for key in keys:
            # a token evicted (or flushed) and cached again starts counting afresh
            self.hits[key] = (self.hits[key] if key in self.stamps else 0) + 1
            self.stamps[key] = self.clock

    def insert_is_refused(self, seq: Seq, ns: object) -> bool:
        m = self.matched(seq, ns)
        overflow = len(self.stamps) + len(seq) - m - self.capacity
        path = {(ns, seq[:i]) for i in range(1, m + 1)}
        evictable = set(self.stamps) - self.pinned_prefixes() - path
        return overflow > 0 and len(evictable) < overflow

    def evict(self, nodes: dict[Key, int], needed: int, protected: set[Key]) -> int:
        """Scan-and-sort LRU over whole nodes (``nodes``: full prefix -> start); returns freed."""
        pinned = self.pinned_prefixes()
        children = Counter((ns, full[:start]) for (ns, full), start in nodes.items())
        freed = 0
        while freed < needed:
            leaves = [k for k in nodes if children[k] == 0 and k not in pinned and k not in protected]
            assert leaves, "reference model found nothing evictable although the insert was feasible"

            def recency(key: Key) -> int:
                ns, full = key
                return max(self.stamps[(ns, full[:i])] for i in range(nodes[key] + 1, len(full) + 1))

            victim = min(leaves, key=recency)
            ns, full = victim
            start = nodes.pop(victim)
            for i in range(start + 1, len(full) + 1):
                del self.stamps[(ns, full[:i])]
            children[(ns, full[:start])] -= 1
            freed += len(full) - start
        return freed

    def remove_untouched_tail(self, seq: Seq, ns: object, matched: int, stamp: int) -> int:
        """Remove what an insert stamped ``stamp`` added past ``matched`` if it is still one unused
        leaf (cached, not extended, unpinned, its last token still at that stamp); returns the
        tokens removed, 0 if none.

        A later split (by an insert or a pin ending inside the leaf) stamps the upper part afresh,
        so the leaf is the run of ``stamp`` at the end of ``seq``."""
        key = (ns, seq)
        if self.stamps.get(key) != stamp or key in self.pinned_prefixes():
            return 0
        if any(n == ns and len(s) > len(seq) and s[: len(seq)] == seq for n, s in self.stamps):
            return 0
        start = len(seq) - 1
        while start > matched and self.stamps[(ns, seq[:start])] == stamp:
            start -= 1
        for i in range(start + 1, len(seq) + 1):
            del self.stamps[(ns, seq[:i])]
        return len(seq) - start


def node_map(tree: RadixTree) -> dict[Key, int]:
    return {(ns, full): start for ns, start, full, _ in walk(tree)}


def node_around(nodes: dict[Key, int], seq: Seq, ns: object, m: int) -> Key | None:
    """The node whose edge the first ``m`` tokens of ``seq`` end strictly inside, if any."""
    for (node_ns, full), start in nodes.items():
        if node_ns == ns and start < m < len(full) and full[:m] == seq[:m]:
            return (node_ns, full)
    return None


# -- the state machine ----------------------------------------------------------------------


class RadixTreeMachine(RuleBasedStateMachine):
    tree: RadixTree
    model: ReferenceCache

    @initialize(capacity=st.integers(min_value=3, max_value=20))
    def create(self, capacity: int) -> None:
        self.tree = RadixTree(capacity)
        self.model = ReferenceCache(capacity)
        self.fresh: set[Key] = set()  # inserted since the last eviction: must still match fully
        # recent inserts that added a leaf: (ns, seq, matched, model stamp, leaf, its stamp, flushes)
        self.added: list[tuple[object, Seq, int, int, RadixNode, int, int]] = []
        self.flushes = 0

    def _any_sequence(self, data: st.DataObject) -> tuple[Seq, object]:
        """A random sequence, or one that shares a prefix with a cached one (to force splits)."""
        ns = data.draw(namespaces)
        cached = sorted(s for (n, s) in self.model.stamps if n == ns)
        if cached and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(cached))
            keep = data.draw(st.integers(min_value=0, max_value=len(base)))
            tail = data.draw(st.lists(tokens, max_size=4).map(tuple))
            seq = base[:keep] + tail
            if seq:
                return seq, ns
        return data.draw(sequences), ns

    @rule(data=st.data(), pin=st.booleans())
    def insert(self, data: st.DataObject, pin: bool) -> None:
        seq, ns = self._any_sequence(data)
        tree, model = self.tree, self.model
        before = snapshot(tree)
        if len(seq) > model.capacity:
            with pytest.raises(ValueError, match="exceeds the cache capacity"):
                tree.insert(seq, namespace=ns, pin=pin)
            assert snapshot(tree) == before
            return
        if model.insert_is_refused(seq, ns):
            with pytest.raises(CacheFullError):
                tree.insert(seq, namespace=ns, pin=pin)
            assert snapshot(tree) == before  # a refused insert changes nothing
            return

        m = model.matched(seq, ns)
        assert m == longest_cached_prefix(tree, seq, ns)
        new = len(seq) - m
        nodes = node_map(tree)
        around = node_around(nodes, seq, ns, m)
        overflow = len(model.stamps) + new - model.capacity
        evicted = 0
        if overflow > 0:
            if around is not None:  # the tree splits that edge first; both halves keep their stamps
                start = nodes.pop(around)
                nodes[(ns, seq[:m])] = start
                nodes[around] = m
            path = {(ns, seq[:i]) for i in range(1, m + 1)}
            evicted = model.evict(nodes, overflow, path)

        evictions_before = tree.evictions_total
        result = tree.insert(seq, namespace=ns, pin=pin)

        assert (result.matched_tokens, result.new_tokens, result.evicted_tokens) == (m, new, evicted)
        touched = [(ns, seq[:i]) for i in range(1, len(seq) + 1)]
        if around is not None and new == 0 and not pin:  # whole edge touched, no split
            touched += [(ns, around[1][:i]) for i in range(m + 1, len(around[1]) + 1)]
        model.touch(touched)
        if pin:
            model.pins[(ns, seq)] += 1
        assert result.cached_tokens == len(model.stamps) == tree.cached_tokens

        if tree.evictions_total != evictions_before:
            self.fresh.clear()
        self.fresh.add((ns, seq))
        if new:
            found = tree.match_prefix(seq, namespace=ns, touch=False)
            assert found.depth_in_node == found.node.num_tokens  # the new leaf ends where seq does
            record = (ns, seq, m, model.clock, found.node, found.node.last_access, self.flushes)
            self.added = [*self.added[-7:], record]

    @rule(data=st.data(), touch=st.booleans())
    def match(self, data: st.DataObject, touch: bool) -> None:
        seq, ns = self._any_sequence(data)
        m = self.model.matched(seq, ns)
        assert m == longest_cached_prefix(self.tree, seq, ns)
        nodes = node_map(self.tree)
        before = snapshot(self.tree)
        result = self.tree.match_prefix(seq, namespace=ns, touch=touch)
        assert result.matched_tokens == m
        assert self.tree.matched_tokens(seq, namespace=ns) == m
        assert snapshot(self.tree) == before  # matching never changes the cached content
        if touch and m:
            self._model_match_touch(seq, ns, m, nodes)

    def _model_match_touch(self, seq: Seq, ns: object, m: int, nodes: dict[Key, int]) -> None:
        touched = [(ns, seq[:i]) for i in range(1, m + 1)]
        around = node_around(nodes, seq, ns, m)
        if around is not None:  # a match ending inside an edge refreshes that whole node
            touched += [(ns, around[1][:i]) for i in range(m + 1, len(around[1]) + 1)]
        self.model.touch(touched)

    @precondition(lambda self: bool(self.model.stamps))
    @rule(data=st.data(), times=st.integers(min_value=20, max_value=120))
    def touch_repeatedly(self, data: st.DataObject, times: int) -> None:
        """Many hits on one prefix pile up stale heap entries and force heap compactions."""
        ns, seq = data.draw(st.sampled_from(sorted(self.model.stamps, key=repr)))
        nodes = node_map(self.tree)
        for _ in range(times):
            assert self.tree.match_prefix(seq, namespace=ns).matched_tokens == len(seq)
            self._model_match_touch(seq, ns, len(seq), nodes)

    @precondition(lambda self: bool(self.model.pins))
    @rule(data=st.data())
    def release_pin(self, data: st.DataObject) -> None:
        ns, seq = data.draw(st.sampled_from(sorted(self.model.pins, key=repr)))
        self.tree.release_pin(seq, namespace=ns)
        self.model.pins[(ns, seq)] -= 1
        if not self.model.pins[(ns, seq)]:
            del self.model.pins[(ns, seq)]

    @rule(seq=sequences, ns=namespaces)
    def release_a_pin_not_held(self, seq: Seq, ns: object) -> None:
        if (ns, seq) in self.model.pins:
            return
        before = snapshot(self.tree)
        with pytest.raises(PinError):
            self.tree.release_pin(seq, namespace=ns)
        assert snapshot(self.tree) == before

    @precondition(lambda self: bool(self.added))
    @rule(data=st.data())
    def remove_leaf(self, data: st.DataObject) -> None:
        """Taking back an insert's leaf removes exactly its untouched tail, or changes nothing."""
        newest_first = self.added[::-1]
        ns, seq, matched, stamp, leaf, leaf_stamp, flushes = data.draw(st.sampled_from(newest_first))
        before = snapshot(self.tree)
        evictions_before = self.tree.evictions_total
        # a leaf from before a clear() is gone even when the model re-cached the same tokens since
        expected = self.model.remove_untouched_tail(seq, ns, matched, stamp) if flushes == self.flushes else 0
        assert self.tree.remove_leaf(leaf, if_untouched_since=leaf_stamp) == expected
        if expected:
            assert self.tree.evictions_total == evictions_before + 1  # followers see it as an eviction
            self.fresh.discard((ns, seq))
        else:
            assert snapshot(self.tree) == before

    @rule(flush=st.integers(min_value=0, max_value=3))
    def clear(self, flush: int) -> None:
        if flush != 3:  # one draw in four (3, not 0, which the generator favours): most runs fill the cache
            return
        self.tree.clear()
        self.model.stamps.clear()
        self.model.pins.clear()
        self.fresh.clear()
        self.flushes += 1

    @rule(needed=st.integers(min_value=1, max_value=12))
    def evict(self, needed: int) -> None:
        unpinned = len(self.model.stamps) - len(self.model.pinned_prefixes())
        before = snapshot(self.tree)
        if needed > unpinned:
            with pytest.raises(CacheFullError):
                self.tree.evict(needed)
            assert snapshot(self.tree) == before
            return
        expected = self.model.evict(node_map(self.tree), needed, set())
        assert self.tree.evict(needed) == expected
        self.fresh.clear()

    # -- invariants, checked after every step ---------------------------------------------

    @invariant()
    def same_content_as_the_model(self) -> None:
        assert cached_prefixes(self.tree) == set(self.model.stamps)

    @invariant()
    def counters_agree_with_a_walk(self) -> None:
        nodes = walk(self.tree)
        assert self.tree.cached_tokens == sum(n.num_tokens for *_, n in nodes)
        assert self.tree.cached_tokens <= self.model.capacity
        assert self.tree.node_count == len(nodes)
        assert self.tree.pinned_tokens == sum(n.num_tokens for *_, n in nodes if n.pin_count > 0)

    @invariant()
    def structure_is_well_formed(self) -> None:
        for ns in self.tree.namespaces():
            root = self.tree.root(ns)
            assert root.parent is None and root.edge == b""
        for _ns, _start, _full, node in walk(self.tree):
            assert node.edge and len(node.edge) % TOKEN_BYTES == 0
            assert node.parent is not None and node.parent.children[node.edge[:TOKEN_BYTES]] is node

    @invariant()
    def pin_counts_match_the_held_pins(self) -> None:
        for ns, _start, full, node in walk(self.tree):
            held = sum(
                c for (pns, seq), c in self.model.pins.items() if pns == ns and seq[: len(full)] == full
            )
            assert node.pin_count == held
        for ns, seq in self.model.pins:
            assert self.tree.matched_tokens(seq, namespace=ns) == len(seq)

    @invariant()
    def hit_counts_are_the_requests_through_each_node(self) -> None:
        # every token of a node is touched together, so a node's count is that of each of its tokens
        for ns, start, full, node in walk(self.tree):
            counts = {self.model.hits[(ns, full[:i])] for i in range(start + 1, len(full) + 1)}
            assert counts == {node.hits}

    @invariant()
    def recent_inserts_are_matchable(self) -> None:
        for ns, seq in self.fresh:
            assert self.tree.matched_tokens(seq, namespace=ns) == len(seq)

    @invariant()
    def every_evictable_leaf_is_on_the_heap_and_the_heap_is_bounded(self) -> None:
        live = {id(node) for stamp, _, node in self.tree._heap if node.last_access == stamp and node.parent}
        for *_, node in walk(self.tree):
            if not node.children and node.pin_count == 0:
                assert id(node) in live
        assert len(self.tree._heap) <= 4 * self.tree.node_count + 64 + 1


RadixTreeMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixTreeAgainstReference = RadixTreeMachine.TestCase


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(sequences, namespaces), max_size=25))
def test_without_capacity_pressure_the_tree_holds_exactly_the_maximal_sequences(
    inserts: list[tuple[Seq, object]],
) -> None:
    tree = RadixTree(1_000)
    for seq, ns in inserts:
        tree.insert(seq, namespace=ns)
    for ns in NAMESPACES:
        mine = {s for s, n in inserts if n == ns}
        maximal = {s for s in mine if not any(o != s and o[: len(s)] == s for o in mine)}
        got = {tuple(s) for s in tree.cached_sequences(ns)} if ns in tree.namespaces() else set()
        assert got == maximal
        for seq in mine:
            assert tree.matched_tokens(seq, namespace=ns) == len(seq)
    assert tree.cached_tokens == len({(ns, s[:i]) for s, ns in inserts for i in range(1, len(s) + 1)})
