"""prefixfleet's queue-aware cost policy: minimise estimated time to first token, fleet-wide.

For each replica: wait before prefill can start + prefill of the suffix it has not cached. Two
things greedy TTFT misses are priced in:

* the work a choice adds delays everyone queued after it, so uncached tokens are charged
  ``1 + externality`` times (prefer a hit unless the queue difference really pays for the miss);
* inserting a new prefix into a full cache evicts someone else's, charged at ``eviction_weight`` of
  their recompute cost.
Ties go to the replica already holding more of the prompt, then to the shorter queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import CostModel, Decision, ReplicaState, RouteRequest, RoutingPolicy, healthy_or_raise


class QueueAware(RoutingPolicy):
    name = "queue_aware"
    reasons = ("cache_hit", "load_balance", "no_match")

    def __init__(
        self,
        cost: CostModel | None = None,
        externality: float = 0.5,
        eviction_weight: float = 0.1,
    ) -> None:
        super().__init__(cost)
        if externality < 0 or eviction_weight < 0:
            raise ValueError("externality and eviction_weight must be >= 0")
        self.externality = externality
        self.eviction_weight = eviction_weight

    def score(self, request: RouteRequest, r: ReplicaState) -> float:
        uncached = request.num_tokens - r.matched_tokens
        prefill = self.cost.prefill_s(request.num_tokens, r.matched_tokens)
        extra = self.externality * uncached * self.cost.prefill_s_per_token
        if r.capacity_tokens:
            overflow = max(0, r.cached_tokens + uncached - r.capacity_tokens)
            extra += self.eviction_weight * overflow * self.cost.prefill_s_per_token
        return r.wait_s + prefill + extra

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        scores = {r.replica_id: self.score(request, r) for r in live}
        chosen = min(live, key=lambda r: (scores[r.replica_id], -r.matched_tokens, r.wait_s))
        best_match = max(r.matched_tokens for r in live)
        if best_match == 0:
            reason = "no_match"
        elif chosen.matched_tokens == best_match:
            reason = "cache_hit"
        else:
            reason = "load_balance"
        return Decision(chosen.replica_id, reason, chosen.matched_tokens, scores)
