"""An approximate, router-side radix tree whose nodes remember which workers ("tenants") saw them.

This is the structure SGLang's cache-aware router keeps (there over characters, here over tokens):
it never holds KV, only the router's belief of what each worker has cached, refreshed by the
router's own decisions and trimmed per worker by periodic LRU eviction.

Prefixes are kept per *namespace* (the request's tenant salt, ``RouteRequest.namespace``), each under
its own root, as the engines and the sidecars' mirrors keep them: two tenants sending the same tokens
never share a node, so one tenant's prefixes cannot change where another's requests go. A worker's
size for the LRU trim counts its tokens over every namespace.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from .radix import TOKEN_BYTES, common_prefix_bytes


class _TenantNode:
    __slots__ = ("children", "edge", "parent", "tenants")

    def __init__(self, edge: bytes, parent: _TenantNode | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[bytes, _TenantNode] = {}
        self.tenants: dict[Hashable, float] = {}  # tenant -> last access time


class TenantTree:
    def __init__(self) -> None:
        self.roots: dict[Hashable, _TenantNode] = {None: _TenantNode(b"", None)}
        self.tenant_tokens: dict[Hashable, int] = {}

    @property
    def root(self) -> _TenantNode:
        """The root of the unsalted namespace (requests without a tenant salt)."""
        return self.roots[None]

    def insert(self, key: bytes, tenant: Hashable, now: float, namespace: Hashable = None) -> None:
        node = self.roots.get(namespace)
        if node is None:
            node = self.roots[namespace] = _TenantNode(b"", None)
        pos = 0
        node.tenants[tenant] = now
        while pos < len(key):
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                leaf = _TenantNode(key[pos:], node)
                leaf.tenants[tenant] = now
                node.children[leaf.edge[:TOKEN_BYTES]] = leaf
                self._grow(tenant, len(leaf.edge))
                return
            common = common_prefix_bytes(child.edge, key, pos)
            if common * TOKEN_BYTES < len(child.edge):
                child = self._split(child, common)
            if tenant not in child.tenants:
                self._grow(tenant, len(child.edge))
            child.tenants[tenant] = now
            pos += len(child.edge)
            node = child

    def _grow(self, tenant: Hashable, nbytes: int) -> None:
        self.tenant_tokens[tenant] = self.tenant_tokens.get(tenant, 0) + nbytes // TOKEN_BYTES

    def _split(self, node: _TenantNode, tokens: int) -> _TenantNode:
        parent = node.parent
        assert parent is not None
        cut = tokens * TOKEN_BYTES
        upper = _TenantNode(node.edge[:cut], parent)
        upper.tenants = dict(node.tenants)
        parent.children[upper.edge[:TOKEN_BYTES]] = upper
        node.edge = node.edge[cut:]
        node.parent = upper
        upper.children[node.edge[:TOKEN_BYTES]] = node
        return upper

    def prefix_match(
        self, key: bytes, live: set[Hashable] | None = None, namespace: Hashable = None
    ) -> tuple[int, Hashable | None]:
        """(matched tokens, most recent tenant owning the deepest matched node) in ``namespace``."""
        node = self.roots.get(namespace)
        if node is None:
            return 0, None
        pos = 0
        matched_node: _TenantNode | None = None
        while pos < len(key):
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            common = common_prefix_bytes(child.edge, key, pos)
            if live is not None and not any(t in live for t in child.tenants):
                break
            pos += common * TOKEN_BYTES
            matched_node = child
            if common * TOKEN_BYTES < len(child.edge):
                break
            node = child
        if matched_node is None:
            return 0, None
        owners = [(ts, t) for t, ts in matched_node.tenants.items() if live is None or t in live]
        if not owners:
            return 0, None
        return pos // TOKEN_BYTES, max(owners, key=lambda o: o[0])[1]

    def evict_tenant_by_size(self, max_tokens: int) -> None:
        """For every tenant over ``max_tokens``, drop its least recently used leaves until under."""
        for tenant, size in list(self.tenant_tokens.items()):
            if size <= max_tokens:
                continue
            heap: list[tuple[float, int, _TenantNode]] = []
            stack = list(self.roots.values())
            while stack:
                node = stack.pop()
                stack.extend(node.children.values())
                if node.parent is not None and self._is_tenant_leaf(node, tenant):
                    heap.append((node.tenants[tenant], id(node), node))
            heapq.heapify(heap)
            while size > max_tokens and heap:
                _, _, node = heapq.heappop(heap)
                del node.tenants[tenant]
                size -= len(node.edge) // TOKEN_BYTES
                parent = node.parent
                if not node.tenants and not node.children and parent is not None:
                    del parent.children[node.edge[:TOKEN_BYTES]]
                if parent is not None and parent.parent is not None and self._is_tenant_leaf(parent, tenant):
                    heapq.heappush(heap, (parent.tenants[tenant], id(parent), parent))
            self.tenant_tokens[tenant] = size
        self._drop_empty_namespaces()

    @staticmethod
    def _is_tenant_leaf(node: _TenantNode, tenant: Hashable) -> bool:
        return tenant in node.tenants and not any(tenant in c.tenants for c in node.children.values())

    def remove_tenant(self, tenant: Hashable) -> None:
        for root in self.roots.values():
            root.tenants.pop(tenant, None)
            # depth first, children before their parent, so a node left with neither tenants nor
            # children goes too (a worker that left must not leave its unique paths behind)
            stack: list[tuple[_TenantNode, bool]] = [(c, False) for c in root.children.values()]
            while stack:
                node, expanded = stack.pop()
                if not expanded:
                    stack.append((node, True))
                    stack.extend((c, False) for c in node.children.values())
                    continue
                node.tenants.pop(tenant, None)
                if not node.tenants and not node.children:
                    assert node.parent is not None
                    del node.parent.children[node.edge[:TOKEN_BYTES]]
        self.tenant_tokens.pop(tenant, None)
        self._drop_empty_namespaces()

    def _drop_empty_namespaces(self) -> None:
        """Forget a tenant salt's root once nothing is left under it (memory stays bounded)."""
        for namespace in [ns for ns, r in self.roots.items() if ns is not None and not r.children]:
            del self.roots[namespace]
