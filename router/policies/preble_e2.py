"""Preble's E2 scheduling: exploit a cached prefix when it is the larger part, else explore.

Exploit: when the uncached part of the prompt is shorter than the best cached part, go to the
least-loaded holder of that prefix. Explore: otherwise, the replica minimising load cost +
eviction cost + prefill cost. Load-driven replication: when the exploit target's estimated TTFT is
more than ``replicate_factor`` × the best explore option's, explore instead, which copies the hot
prefix to another replica (Preble replicates a prefix whose TTFT doubled).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import (
    CostModel,
    Decision,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
    check_param,
    healthy_or_raise,
    least,
)


class PrebleE2(RoutingPolicy):
    name = "preble_e2"
    reasons = ("exploit", "explore", "replicate")

    def __init__(self, cost: CostModel | None = None, replicate_factor: float = 2.0) -> None:
        super().__init__(cost)
        check_param("replicate_factor", replicate_factor, low=1.0)
        self.replicate_factor = replicate_factor

    def _explore_cost(self, request: RouteRequest, r: ReplicaState) -> float:
        new_tokens = request.num_tokens - r.matched_tokens
        prefill = self.cost.prefill_s(request.num_tokens, r.matched_tokens)
        overflow = max(0, r.cached_tokens + new_tokens - r.capacity_tokens) if r.capacity_tokens else 0
        eviction = overflow * self.cost.prefill_s_per_token  # recomputing what we push out
        return r.wait_s + eviction + prefill

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        best_match = max(r.matched_tokens for r in live)
        explore = least(request, live, lambda r: self._explore_cost(request, r))
        if best_match > 0 and request.num_tokens - best_match < best_match:
            holders = [r for r in live if r.matched_tokens == best_match]
            target = least(request, holders, lambda r: (r.wait_s, r.in_flight))
            if self.estimated_ttft_s(request, target) > self.replicate_factor * self.estimated_ttft_s(
                request, explore
            ):
                return Decision(explore.replica_id, "replicate", explore.matched_tokens)
            return Decision(target.replica_id, "exploit", target.matched_tokens)
        return Decision(explore.replica_id, "explore", explore.matched_tokens)
