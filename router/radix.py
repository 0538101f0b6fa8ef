"""Token-level compressed radix tree: the prefix index of one replica's KV cache.

Design choices (why, briefly):

* Edges hold their tokens as ``bytes`` of little-endian uint32 — 4 bytes a token, immutable,
  and compared with ``memcmp`` instead of a Python loop over ints.
* Eviction pops least-recently-used *unpinned leaves* from a lazily-invalidated heap, so an
  eviction costs O(log n) rather than a scan of the tree. Stale heap entries are skipped on pop
  and the heap is compacted when it grows well beyond the number of nodes.
* Inserts are atomic without copying the tree: feasibility (capacity, pinned tokens, the path
  being extended) is decided before the first mutation, so a refused insert changes nothing.
* Pins are reference counts on every node of a path (like SGLang's ``lock_ref``); a node with a
  non-zero count is never evicted.
* An optional namespace (tenant / cache-identity key) gives each key its own root, so identical
  tokens under different keys never share a node; capacity is shared.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .little_endian import pack_le, unpack_le

TOKEN_BYTES = 4
Tokens = bytes | bytearray | memoryview | array | Iterable[int]


class CacheFullError(RuntimeError):
    """An insert cannot fit: what is left to evict is pinned or on the path being extended."""


class PinError(ValueError):
    """A pin was released that is not held."""


def as_token_bytes(tokens: Tokens) -> bytes:
    """Encode tokens as little-endian uint32 bytes (the tree's edge format).

    ``bytes``/``bytearray``/``memoryview`` are taken as already encoded; an ``array('I')`` or any
    iterable of ints is encoded. Raises ``ValueError`` for a token outside [0, 2**32).
    """
    if isinstance(tokens, bytes):
        if len(tokens) % TOKEN_BYTES:
            raise ValueError("encoded token bytes must be a multiple of 4 long")
        return tokens
    if isinstance(tokens, bytearray | memoryview):
        return as_token_bytes(bytes(tokens))
    if isinstance(tokens, array) and tokens.typecode == "I" and tokens.itemsize == TOKEN_BYTES:
        arr = tokens
    else:
        try:
            arr = array("I", tokens)
        except OverflowError as exc:
            raise ValueError(f"token ids must be in [0, 2**32): {exc}") from None
        except TypeError as exc:
            raise ValueError(f"tokens must be integers: {exc}") from None
    return pack_le(arr)


def decode_tokens(data: bytes) -> list[int]:
    """Inverse of :func:`as_token_bytes`."""
    return unpack_le("I", data).tolist()


def common_prefix_bytes(a: bytes, b: bytes, start_b: int = 0) -> int:
    """Number of leading whole tokens ``a`` shares with ``b[start_b:]``, via O(log n) memcmps."""
    n = min(len(a), len(b) - start_b) // TOKEN_BYTES
    if a[: n * TOKEN_BYTES] == b[start_b : start_b + n * TOKEN_BYTES]:
        return n
    lo, hi = 0, n  # invariant: first lo tokens equal, first hi tokens differ
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[: mid * TOKEN_BYTES] == b[start_b : start_b + mid * TOKEN_BYTES]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixNode:
    __slots__ = ("children", "edge", "hits", "last_access", "parent", "pin_count")

    def __init__(self, edge: bytes, parent: RadixNode | None, last_access: int) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[bytes, RadixNode] = {}
        self.last_access = last_access
        self.pin_count = 0
        self.hits = 0

    @property
    def num_tokens(self) -> int:
        return len(self.edge) // TOKEN_BYTES

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"RadixNode(tokens={self.num_tokens}, children={len(self.children)}, pins={self.pin_count})"


@dataclass(frozen=True, slots=True)
class InsertResult:
    matched_tokens: int
    new_tokens: int
    cached_tokens: int
    evicted_tokens: int


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    matched_tokens: int
    node: RadixNode  # deepest node the match reaches (the match may end inside its edge)
    depth_in_node: int  # tokens of ``node.edge`` covered by the match


class RadixTree:
    """Compressed radix tree over token ids with a token capacity, LRU eviction and pins."""

    def __init__(self, capacity_tokens: int) -> None:
        if not isinstance(capacity_tokens, int) or capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be a positive integer, got {capacity_tokens!r}")
        self.capacity_tokens = capacity_tokens
        self._roots: dict[object, RadixNode] = {}
        # each root's namespace, so a root left without children can go (see _detach_leaf)
        self._root_namespaces: dict[RadixNode, object] = {}
        self._clock = 0
        self._cleared_at = 0  # the recency clock's value at the last clear()
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._heap_seq = 0
        self._pins: dict[tuple[object, bytes], int] = {}
        self.cached_tokens = 0
        self.pinned_tokens = 0  # tokens in nodes with pin_count > 0
        self.node_count = 0  # excluding roots
        self.evicted_tokens_total = 0
        self.evictions_total = 0  # nodes evicted

    # -- lookups ---------------------------------------------------------------------------

    def root(self, namespace: object = None) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = RadixNode(b"", None, 0)
            self._roots[namespace] = root
            self._root_namespaces[root] = namespace
        return root

    def _walk(
        self, key: bytes, namespace: object, create: bool = False
    ) -> tuple[int, RadixNode, int, list[RadixNode]]:
        """Longest match of ``key``: (matched tokens, deepest node, tokens into its edge, full path).

        ``path`` lists the fully matched nodes; a node matched only partly is returned as ``node``
        with ``depth < node.num_tokens`` and is not on ``path``.
        """
        node = self._roots.get(namespace)
        if node is None:
            return 0, (self.root(namespace) if create else RadixNode(b"", None, 0)), 0, []
        pos = 0
        path: list[RadixNode] = []
        n = len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            edge = child.edge
            elen = len(edge)
            if key.startswith(edge, pos):  # compares in place, no slice copy
                pos += elen
                node = child
                path.append(child)
                continue
            common = common_prefix_bytes(edge, key, pos)
            return (pos // TOKEN_BYTES) + common, child, common, path
        return pos // TOKEN_BYTES, node, node.num_tokens, path

    def match_prefix(self, tokens: Tokens, namespace: object = None, *, touch: bool = True) -> PrefixMatch:
        """Longest cached prefix of ``tokens``. Never changes the tree's shape.

        With ``touch`` (the default) the matched path becomes most recently used and its hit counts
        rise; routers that only *probe* many replicas pass ``touch=False``.
        """
        key = as_token_bytes(tokens)
        matched, node, depth, path = self._walk(key, namespace)
        if touch and matched:
            self._clock += 1
            for p in path:
                p.last_access = self._clock
                p.hits += 1
            if depth < node.num_tokens and node.parent is not None:  # match ended inside an edge
                node.last_access = self._clock
                node.hits += 1
                self._push_if_leaf(node)
            elif path:
                self._push_if_leaf(path[-1])
        return PrefixMatch(matched, node, depth)

    def matched_tokens(self, tokens: Tokens, namespace: object = None) -> int:
        """Probe-only shortcut: length of the longest cached prefix, no recency update."""
        return self._walk(as_token_bytes(tokens), namespace)[0]

    def __contains__(self, tokens: Tokens) -> bool:
        key = as_token_bytes(tokens)
        return self._walk(key, None)[0] * TOKEN_BYTES == len(key)

    # -- insert ------------------------------------------------------------------------------

    def insert(self, tokens: Tokens, namespace: object = None, *, pin: bool = False) -> InsertResult:
        """Cache ``tokens``; evict LRU unpinned leaves if needed.

        Raises ``ValueError`` when the sequence alone exceeds capacity and :class:`CacheFullError`
        when the space it needs is pinned or on its own path; in both cases the tree is unchanged.
        """
        key = as_token_bytes(tokens)
        n_tokens = len(key) // TOKEN_BYTES
        if n_tokens > self.capacity_tokens:
            raise ValueError(
                f"sequence of {n_tokens} tokens exceeds the cache capacity of {self.capacity_tokens} tokens"
            )
        matched, node, depth, path = self._walk(key, namespace)
        new_tokens = n_tokens - matched
        overflow = self.cached_tokens + new_tokens - self.capacity_tokens
        if overflow > 0:
            # Feasibility before any mutation: tokens that can never be freed for this insert are the
            # pinned ones plus the unpinned part of the path it extends (incl. a partly matched edge).
            protected = sum(len(p.edge) for p in path if not p.pin_count) // TOKEN_BYTES
            if depth < node.num_tokens and node.parent is not None and node.pin_count == 0:
                protected += depth
            evictable = self.cached_tokens - self.pinned_tokens - protected
            if evictable < overflow:
                raise CacheFullError(
                    f"cannot cache {new_tokens} new tokens: {self.cached_tokens}/{self.capacity_tokens} "
                    f"tokens in use, {self.pinned_tokens} pinned and {protected} on the extended path"
                )
        if namespace not in self._roots:  # created only now, so a refused insert adds no namespace
            node = self.root(namespace)
        self._clock += 1
        now = self._clock
        if depth < node.num_tokens and node.parent is not None and (new_tokens > 0 or pin):
            node = self._split(node, depth)
            path.append(node)
        elif depth < node.num_tokens and node.parent is not None:
            path.append(node)  # fully matched inside an edge: touch it, shape unchanged
        evicted = 0
        if overflow > 0 and path:
            # Holding the deepest path node holds the whole path: an ancestor keeps a child on the
            # path, so it never becomes an evictable leaf. O(1) instead of pinning every node.
            tip = path[-1]
            self._pin_node(tip)
            try:
                evicted = self._evict(overflow)
            finally:
                self._unpin_node(tip)
        elif overflow > 0:
            evicted = self._evict(overflow)
            # nothing matched, so ``node`` is the namespace's root, which the eviction may have
            # emptied and dropped: hang the new leaf under the live root
            node = self.root(namespace)
        for p in path:
            p.last_access = now
            p.hits += 1
        if new_tokens > 0:
            # ``node`` is now the deepest node ending exactly at ``matched`` (a root when nothing matched)
            leaf = RadixNode(key[matched * TOKEN_BYTES :], node, now)
            leaf.hits = 1
            node.children[leaf.edge[:TOKEN_BYTES]] = leaf
            self.cached_tokens += new_tokens
            self.node_count += 1
            path.append(leaf)
        if pin:
            for p in path:
                self._pin_node(p)
            pin_key = (namespace, key)
            self._pins[pin_key] = self._pins.get(pin_key, 0) + 1
        if path:
            self._push_if_leaf(path[-1])
        return InsertResult(matched, new_tokens, self.cached_tokens, evicted)

    def _split(self, node: RadixNode, depth: int) -> RadixNode:
        """Split ``node``'s edge after ``depth`` tokens; return the new upper node."""
        parent = node.parent
        assert parent is not None and 0 < depth < node.num_tokens
        cut = depth * TOKEN_BYTES
        upper = RadixNode(node.edge[:cut], parent, node.last_access)
        upper.pin_count = node.pin_count
        upper.hits = node.hits
        parent.children[upper.edge[:TOKEN_BYTES]] = upper
        node.edge = node.edge[cut:]
        node.parent = upper
        upper.children[node.edge[:TOKEN_BYTES]] = node
        self.node_count += 1
        return upper

    # -- pins --------------------------------------------------------------------------------

    def _pin_node(self, node: RadixNode) -> None:
        if node.pin_count == 0:
            self.pinned_tokens += node.num_tokens
        node.pin_count += 1

    def _unpin_node(self, node: RadixNode) -> None:
        node.pin_count -= 1
        if node.pin_count == 0:
            self.pinned_tokens -= node.num_tokens
            self._push_if_leaf(node)

    def release_pin(self, tokens: Tokens, namespace: object = None) -> None:
        """Release one pin taken by ``insert(..., pin=True)`` on exactly this sequence."""
        key = as_token_bytes(tokens)
        pin_key = (namespace, key)
        held = self._pins.get(pin_key, 0)
        if held < 1:
            raise PinError(f"no pin is held on this {len(key) // TOKEN_BYTES}-token sequence")
        matched, _node, depth, path = self._walk(key, namespace)
        if matched * TOKEN_BYTES != len(key) or (path and depth != path[-1].num_tokens):
            raise RuntimeError("pinned sequence is missing from the tree (internal invariant broken)")
        for p in reversed(path):
            self._unpin_node(p)
        if held == 1:
            del self._pins[pin_key]
        else:
            self._pins[pin_key] = held - 1

    def pinned_sequences(self) -> dict[tuple[object, bytes], int]:
        return dict(self._pins)

    # -- eviction ----------------------------------------------------------------------------

    def _push_if_leaf(self, node: RadixNode) -> None:
        if not node.children and node.pin_count == 0 and node.parent is not None:
            self._heap_seq += 1
            heapq.heappush(self._heap, (node.last_access, self._heap_seq, node))
            self._bound_heap()

    def _bound_heap(self) -> None:
        # Checked after removals too: they shrink node_count without a push, so a push-side bound
        # alone lets stale entries outnumber the live tree (70 for 1 node, found by the stateful test).
        if len(self._heap) > 4 * self.node_count + 64:
            self._compact_heap()

    def _compact_heap(self) -> None:
        self._heap = [e for e in self._heap if self._is_live_entry(e)]
        heapq.heapify(self._heap)

    @staticmethod
    def _is_live_entry(entry: tuple[int, int, RadixNode]) -> bool:
        stamp, _, node = entry
        return (
            node.parent is not None
            and not node.children
            and node.pin_count == 0
            and (node.last_access == stamp)
        )

    def _evict(self, needed: int) -> int:
        freed = 0
        while freed < needed:
            # Re-read ``self._heap`` every round: _detach_leaf pushing a parent may compact (rebind) it.
            if not self._heap:
                raise CacheFullError(f"cannot free {needed - freed} more tokens: nothing evictable")
            entry = heapq.heappop(self._heap)
            if not self._is_live_entry(entry):
                continue
            freed += self._detach_leaf(entry[2])
        self._bound_heap()
        return freed

    def _detach_leaf(self, node: RadixNode) -> int:
        """Take an unpinned leaf out of the tree, counted as an eviction; returns its tokens."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.edge[:TOKEN_BYTES]]
        node.parent = None  # detached: its heap entries are stale and skipped
        size = node.num_tokens
        self.cached_tokens -= size
        self.node_count -= 1
        self.evicted_tokens_total += size
        self.evictions_total += 1
        if parent.parent is not None:
            self._push_if_leaf(parent)  # left childless: a leaf to evict in turn
        elif not parent.children:
            # A namespace (tenant salt) holding nothing more: its root goes, or every salt ever
            # seen kept one (clients may salt each request) and the namespace lists grew forever.
            namespace = self._root_namespaces.pop(parent, None)
            if self._roots.get(namespace) is parent:
                del self._roots[namespace]
        return size

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` tokens of LRU unpinned leaves (or raise CacheFullError)."""
        evictable = self.cached_tokens - self.pinned_tokens
        if tokens > evictable:
            raise CacheFullError(f"cannot evict {tokens} tokens: only {evictable} are unpinned")
        return self._evict(tokens)

    def remove_leaf(self, leaf: RadixNode, *, if_untouched_since: int) -> int:
        """Take back the tokens one insert added, if nothing used them since; returns the tokens removed.

        ``leaf`` is the node an insert created (the one its sequence ends in) and
        ``if_untouched_since`` that node's ``last_access`` right after the insert. The leaf goes
        only while it is still in this tree (not evicted, not cleared), a leaf (nothing extended
        it), unpinned, and untouched (no match or insert reached into it since, which would give it
        a later stamp). A later insert that split it leaves this node the lower part, so only the
        tokens below the split go. Otherwise nothing changes and 0 is returned.

        Counted as an eviction (``evictions_total``, ``evicted_tokens_total``): a removed node is
        detached exactly as an evicted one, and followers of the tree such as the summary's block
        index find detached nodes by that count. The parent is left as it is, as after an eviction:
        edges are not merged back, and a parent left childless becomes an evictable leaf.
        """
        if leaf.parent is None or leaf.children or leaf.pin_count or leaf.last_access != if_untouched_since:
            return 0
        if if_untouched_since <= self._cleared_at:
            return 0  # from before the last clear(): the clock is never reset, no live node is as old
        size = self._detach_leaf(leaf)
        self._bound_heap()
        return size

    def clear(self) -> None:
        """Drop everything, pins included (a flush: the engine's cache identity changed)."""
        self._cleared_at = self._clock
        self._roots.clear()
        self._root_namespaces.clear()
        self._heap.clear()
        self._pins.clear()
        self.cached_tokens = 0
        self.pinned_tokens = 0
        self.node_count = 0

    # -- introspection -----------------------------------------------------------------------

    def namespaces(self) -> list[object]:
        return list(self._roots)

    def namespace_of(self, root: RadixNode) -> object:
        """The namespace whose live root ``root`` is, in O(1) (followers of the tree, such as the
        summary's block index, find a top node's namespace so; a scan of :meth:`namespaces` cost
        time linear in the live tenants per insert). KeyError when ``root`` is no live root: not a
        root, or one dropped with its namespace's last node or by :meth:`clear`."""
        namespace = self._root_namespaces[root]
        if self._roots.get(namespace) is not root:
            raise KeyError(root)
        return namespace

    def iter_nodes(self, namespace: object = None) -> Iterator[tuple[int, RadixNode]]:
        """Depth-first (prefix length at node end, node) pairs under one namespace."""
        root = self._roots.get(namespace)
        if root is None:
            return
        stack = [(0, child) for child in root.children.values()]
        while stack:
            depth, node = stack.pop()
            end = depth + node.num_tokens
            yield end, node
            stack.extend((end, c) for c in node.children.values())

    def cached_sequences(self, namespace: object = None) -> list[list[int]]:
        """Every root-to-leaf token sequence (for tests and debugging; O(cached tokens))."""
        out: list[list[int]] = []
        root = self._roots.get(namespace)
        if root is None:
            return out
        stack: list[tuple[bytes, RadixNode]] = [(b"", c) for c in root.children.values()]
        while stack:
            prefix, node = stack.pop()
            seq = prefix + node.edge
            if not node.children:
                out.append(decode_tokens(seq))
            stack.extend((seq, c) for c in node.children.values())
        return out

    def memory_bytes(self) -> int:
        """Approximate resident bytes: nodes, edges, child maps and their keys, the eviction heap."""
        getsizeof = sys.getsizeof
        total = getsizeof(self._roots) + getsizeof(self._heap)
        # heap entries are (stamp, seq, node) tuples holding two ints of their own
        total += sum(getsizeof(e) + getsizeof(e[0]) + getsizeof(e[1]) for e in self._heap)
        for root in self._roots.values():
            stack = [root]
            while stack:
                node = stack.pop()
                total += getsizeof(node) + getsizeof(node.edge) + getsizeof(node.last_access)
                total += getsizeof(node.children) + sum(getsizeof(k) for k in node.children)
                stack.extend(node.children.values())
        return total
