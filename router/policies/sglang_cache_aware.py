"""A port of SGLang router's ``cache_aware`` policy, on tokens instead of characters.

Rules (sgl-router): with min/max the smallest/largest in-flight request count over workers, the pool
is imbalanced iff ``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``;
then the least-loaded worker wins. Otherwise ``match_rate = matched / input`` over the router's own
approximate tree; above ``cache_threshold`` the worker owning the matched node wins, else the least
loaded. The text is inserted under the chosen worker either way, and every
``eviction_interval_s`` each worker's share of the tree is trimmed to ``max_tree_size`` by LRU.
Unlike sgl-router, which knows no tenants, the tree keeps each tenant salt's prefixes apart (the
engines do too): a tenant's requests never follow another tenant's identical prefix.
Defaults are the ones users get from the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..tenant_tree import TenantTree
from .base import (
    CostModel,
    Decision,
    ReplicaId,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
    check_param,
    healthy_or_raise,
)


class SGLangCacheAware(RoutingPolicy):
    name = "sglang_cache_aware"
    reasons = ("imbalanced", "cache_hit", "low_match")

    def __init__(
        self,
        cost: CostModel | None = None,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size: int = 2**26,
    ) -> None:
        super().__init__(cost)
        if not 0.0 <= cache_threshold <= 1.0:  # NaN fails this too
            raise ValueError(f"cache_threshold must be within [0, 1], got {cache_threshold!r}")
        check_param("balance_abs_threshold", balance_abs_threshold)
        check_param("balance_rel_threshold", balance_rel_threshold)
        check_param("eviction_interval_s", eviction_interval_s, strict=True)
        check_param("max_tree_size", max_tree_size)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size
        self.tree = TenantTree()
        self._next_eviction: float | None = None

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        self._maybe_evict(request.now)
        loads = [r.in_flight for r in live]
        lo, hi = min(loads), max(loads)
        least = min(live, key=lambda r: r.in_flight)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            return Decision(least.replica_id, "imbalanced", least.matched_tokens)
        by_id = {r.replica_id: r for r in live}
        matched, owner = self.tree.prefix_match(request.tokens, set(by_id), _namespace(request))
        rate = matched / request.num_tokens if request.num_tokens else 0.0
        if owner is not None and rate > self.cache_threshold:
            return Decision(owner, "cache_hit", by_id[owner].matched_tokens)
        return Decision(least.replica_id, "low_match", least.matched_tokens)

    def on_routed(self, request: RouteRequest, decision: Decision) -> None:
        self.tree.insert(request.tokens, decision.replica_id, request.now, _namespace(request))

    def on_replica_removed(self, replica_id: ReplicaId) -> None:
        self.tree.remove_tenant(replica_id)

    def _maybe_evict(self, now: float) -> None:
        if self._next_eviction is None:
            self._next_eviction = now + self.eviction_interval_s
        elif now >= self._next_eviction:
            self.tree.evict_tenant_by_size(self.max_tree_size)
            self._next_eviction = now + self.eviction_interval_s


def _namespace(request: RouteRequest) -> object:
    """The request's tenant salt, an empty one being no salt (as ``blockhash.salted_seed`` has it)."""
    return request.namespace or None
