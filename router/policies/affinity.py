"""Pure prefix affinity: the longest cached prefix wins, load ignored (the hotspot-maker)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from .base import Decision, ReplicaState, RouteRequest, RoutingPolicy, healthy_or_raise, least


class Affinity(RoutingPolicy):
    name = "affinity"
    reasons = ("cache_hit", "no_match")

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        best = least(request, live, lambda r: -r.matched_tokens)
        if best.matched_tokens > 0:
            return Decision(best.replica_id, "cache_hit", best.matched_tokens)
        # Nobody has it: a stable hash of the first tokens keeps a new prefix on one replica.
        chosen = live[zlib.crc32(request.tokens[:64]) % len(live)]
        return Decision(chosen.replica_id, "no_match", 0)
