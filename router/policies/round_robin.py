"""Cache-blind rotation: the common gateway default and the baseline everything is compared to."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from .base import CostModel, Decision, ReplicaState, RouteRequest, RoutingPolicy, healthy_or_raise


class RoundRobin(RoutingPolicy):
    name = "round_robin"
    reasons = ("round_robin",)

    def __init__(self, cost: CostModel | None = None) -> None:
        super().__init__(cost)
        self._cursor: int | None = None

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        if self._cursor is None:
            # Each instance (one per gateway) starts at an offset hashed from its first request's
            # time, as Envoy's round robin starts at a random host. Starting at 0, every gateway sent
            # its first request to the same replica, and gateways a client alternates between stepped
            # in lockstep: each replica got requests in pairs. A hash, not a random draw, keeps the
            # simulator's runs repeatable.
            when = hashlib.blake2b(struct.pack("<d", request.now), digest_size=8).digest()
            self._cursor = int.from_bytes(when, "little")
        chosen = live[self._cursor % len(live)]
        self._cursor += 1
        return Decision(chosen.replica_id, "round_robin", chosen.matched_tokens)
