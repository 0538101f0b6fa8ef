"""Cache-blind rotation: the common gateway default and the baseline everything is compared to."""

from __future__ import annotations

from collections.abc import Sequence

from .base import CostModel, Decision, ReplicaState, RouteRequest, RoutingPolicy, healthy_or_raise


class RoundRobin(RoutingPolicy):
    name = "round_robin"
    reasons = ("round_robin",)

    def __init__(self, cost: CostModel | None = None) -> None:
        super().__init__(cost)
        self._cursor = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        chosen = live[self._cursor % len(live)]
        self._cursor += 1
        return Decision(chosen.replica_id, "round_robin", chosen.matched_tokens)
