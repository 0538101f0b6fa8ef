"""Cache-blind least-loaded: the replica with the least outstanding work wins."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, ReplicaState, RouteRequest, RoutingPolicy, healthy_or_raise, least


class LeastLoaded(RoutingPolicy):
    name = "least_loaded"
    reasons = ("least_loaded",)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        chosen = least(request, live, lambda r: (r.wait_s, r.in_flight))
        return Decision(chosen.replica_id, "least_loaded", chosen.matched_tokens)
