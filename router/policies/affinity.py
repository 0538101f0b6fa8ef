"""Pure prefix affinity: the longest cached prefix wins, load ignored (the hotspot-maker)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import (
    Decision,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
    healthy_or_raise,
    least,
    rendezvous,
)

_HEAD_BYTES = 64  # the first 16 tokens (4 bytes each) name a new prefix's home


def home(request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
    """The replica a prefix nobody holds goes to: the highest hash of the prompt's head with the
    replica's id (rendezvous hashing). A hash modulo the list's length moved nearly every new prefix
    whenever a replica joined or left, and two gateways listing the same replicas in different orders
    (each lists them as it first saw them) sent the same prefix to different replicas; this moves only
    the prefixes of the replica that came or went, whatever the order."""
    return rendezvous(request.tokens[:_HEAD_BYTES], replicas)


class Affinity(RoutingPolicy):
    name = "affinity"
    reasons = ("cache_hit", "no_match")

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        best = least(request, live, lambda r: -r.matched_tokens)
        if best.matched_tokens > 0:
            return Decision(best.replica_id, "cache_hit", best.matched_tokens)
        # Nobody has it: a stable hash of the first tokens keeps a new prefix on one replica.
        return Decision(home(request, live).replica_id, "no_match", 0)
