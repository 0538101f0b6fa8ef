"""Routing policies: one module each, one interface (:class:`RoutingPolicy`)."""

from __future__ import annotations

from typing import Any

from .affinity import Affinity
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
from .round_robin import RoundRobin

POLICIES: dict[str, type[RoutingPolicy]] = {cls.name: cls for cls in (RoundRobin, LeastLoaded, Affinity)}

DEFAULT_POLICY = "affinity"


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
