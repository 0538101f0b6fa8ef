"""prefixroute's bounded affinity: longest cached prefix, unless that replica is too much busier.

The longest-prefix replica wins unless its projected wait exceeds the least-loaded replica's by more
than ``load_slack_s``; then the least-loaded replica wins. Locality is a preference, not a prison.
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


class AffinityBalanced(RoutingPolicy):
    name = "affinity_balanced"
    reasons = ("cache_hit", "load_guard", "no_match")

    def __init__(self, cost: CostModel | None = None, load_slack_s: float = 0.05) -> None:
        super().__init__(cost)
        check_param("load_slack_s", load_slack_s)
        self.load_slack_s = load_slack_s

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        idlest = least(request, live, lambda r: (r.wait_s, r.in_flight))
        best = least(request, live, lambda r: (-r.matched_tokens, r.wait_s))
        if best.matched_tokens == 0:
            return Decision(idlest.replica_id, "no_match", idlest.matched_tokens)
        if best.wait_s - idlest.wait_s > self.load_slack_s:
            return Decision(idlest.replica_id, "load_guard", idlest.matched_tokens)
        return Decision(best.replica_id, "cache_hit", best.matched_tokens)
