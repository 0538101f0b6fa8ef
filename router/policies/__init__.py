"""Routing policies: one module each, one interface (:class:`RoutingPolicy`)."""

from __future__ import annotations

from typing import Any

from .affinity import Affinity
from .affinity_balanced import AffinityBalanced
from .base import (
    CostModel,
    Decision,
    NoReplicaError,
    ReplicaId,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)
from .least_loaded import LeastLoaded
from .preble_e2 import PrebleE2
from .queue_aware import QueueAware
from .round_robin import RoundRobin
from .sglang_cache_aware import SGLangCacheAware

POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        LeastLoaded,
        Affinity,
        AffinityBalanced,
        SGLangCacheAware,
        PrebleE2,
        QueueAware,
    )
}

# Chosen by the simulator comparison (docs/policies.md, `prefixfleet bench policies --seeds 0-8`). It
# does not win everywhere. It equals the ideal on lab-burst and beats every peer on the Mooncake trace
# (p99 0.92x, mean 0.94x). On the generated workloads it is level with the best peer over nine seeds:
# prefixroute mean 0.97-1.08x the best peer's (p99 0.40-2.20x), gsp mean 0.96-1.05x.
DEFAULT_POLICY = "queue_aware"


def make_policy(name: str, cost: CostModel | None = None, **params: Any) -> RoutingPolicy:
    """Instantiate a policy by its registered name; unknown names raise ``ValueError``."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(cost, **params)


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CostModel",
    "Decision",
    "NoReplicaError",
    "ReplicaId",
    "ReplicaState",
    "RouteRequest",
    "RoutingPolicy",
    "make_policy",
]
