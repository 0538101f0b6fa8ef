"""Baseline for ``prefixfleet bench tree``: the seed lab's prefix-tree algorithm, re-implemented.

This is our own code, written only to reproduce the *costs* of the teaching lab's design so the
benchmark compares like with like:

* edges are tuples of Python ints, compared one token at a time;
* every insert first deep-copies the whole tree (and its counters) so a failed insert can roll back;
* every eviction scans the whole tree for unpinned leaves and sorts them by last access, once per
  victim;
* a match walks back up to the root stamping each ancestor's last access.

It is not used by the product. ``load`` (insert without the snapshot) exists only so the benchmark can
pre-populate a large tree in reasonable time; timed operations always use ``insert``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field


class LabCacheFull(RuntimeError):
    """Nothing unpinned is left to evict."""


@dataclass
class LabNode:
    tokens: tuple[int, ...] = ()
    parent: LabNode | None = None
    children: dict[int, LabNode] = field(default_factory=dict)
    last_access: int = 0
    pins: int = 0


class LabTree:
    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens <= 0:
            raise ValueError("capacity_tokens must be positive")
        self.capacity_tokens = capacity_tokens
        self.root = LabNode()
        self.clock = 0
        self.cached_tokens = 0
        self.evicted_tokens_total = 0
        self.pins: dict[tuple[int, ...], int] = {}

    # -- recency -------------------------------------------------------------------------

    def _stamp_path(self, node: LabNode) -> None:
        self.clock += 1
        while node is not self.root and node is not None:
            node.last_access = self.clock
            node = node.parent  # type: ignore[assignment]

    # -- lookups -------------------------------------------------------------------------

    def match_prefix(self, tokens: tuple[int, ...]) -> tuple[int, LabNode]:
        node, pos, n = self.root, 0, len(tokens)
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            edge = child.tokens
            same = 0
            limit = min(len(edge), n - pos)
            while same < limit and edge[same] == tokens[pos + same]:
                same += 1
            pos += same
            node = child
            if same < len(edge):
                break
        if node is not self.root:
            self._stamp_path(node)
        return pos, node

    def node_count(self) -> int:
        count, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    # -- eviction ------------------------------------------------------------------------

    def _lru_leaves(self) -> list[LabNode]:
        found: list[LabNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.pins == 0:
                found.append(node)
        found.sort(key=lambda leaf: leaf.last_access)
        return found

    def evict(self, needed: int) -> int:
        freed = 0
        while freed < needed:
            leaves = self._lru_leaves()  # a full scan and sort for every single victim
            if not leaves:
                raise LabCacheFull(f"cannot free {needed} tokens: everything left is pinned")
            victim = leaves[0]
            assert victim.parent is not None
            del victim.parent.children[victim.tokens[0]]
            size = len(victim.tokens)
            self.cached_tokens -= size
            self.evicted_tokens_total += size
            freed += size
        return freed

    # -- insert --------------------------------------------------------------------------

    def insert(self, tokens: tuple[int, ...], pin: bool = False) -> tuple[int, int]:
        """Insert with whole-tree rollback; returns (matched tokens, new tokens)."""
        if len(tokens) > self.capacity_tokens:
            raise ValueError("sequence longer than the cache capacity")
        saved = (copy.deepcopy(self.root), self.cached_tokens, self.evicted_tokens_total, self.clock)
        try:
            result = self.load(tokens, pin)
        except Exception:
            self.root, self.cached_tokens, self.evicted_tokens_total, self.clock = saved
            raise
        if pin:
            self.pins[tokens] = self.pins.get(tokens, 0) + 1
        return result

    def load(self, tokens: tuple[int, ...], pin: bool = False) -> tuple[int, int]:
        """The insert itself, without the snapshot (benchmark set-up only)."""
        node, pos, n = self.root, 0, len(tokens)
        while pos < n:
            head = tokens[pos]
            child = node.children.get(head)
            if child is None:
                break
            edge = child.tokens
            same = 0
            limit = min(len(edge), n - pos)
            while same < limit and edge[same] == tokens[pos + same]:
                same += 1
            pos += same
            if same == len(edge):
                node = child
                continue
            upper = LabNode(edge[:same], node, last_access=child.last_access, pins=child.pins)
            node.children[head] = upper
            child.tokens = edge[same:]
            child.parent = upper
            upper.children[child.tokens[0]] = child
            node = upper
            break
        matched = pos
        new = n - pos
        if new:
            overflow = self.cached_tokens + new - self.capacity_tokens
            if overflow > 0:
                # the path being extended is held by temporary pins while evicting
                held: list[LabNode] = []
                walker: LabNode | None = node
                while walker is not None and walker is not self.root:
                    walker.pins += 1
                    held.append(walker)
                    walker = walker.parent
                try:
                    self.evict(overflow)
                finally:
                    for held_node in held:
                        held_node.pins -= 1
            leaf = LabNode(tokens[pos:], node, last_access=self.clock + 1)
            node.children[leaf.tokens[0]] = leaf
            self.cached_tokens += new
            node = leaf
        if pin:
            walker = node
            while walker is not None and walker is not self.root:
                walker.pins += 1
                walker = walker.parent
        self._stamp_path(node)
        return matched, new
