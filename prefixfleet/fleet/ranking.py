"""Do two measurements rank routing policies the same way? (simulator vs live fleet)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any


def rank_policies(metrics: Mapping[str, Mapping[str, Any]], key: str = "mean_ttft_ms") -> list[str]:
    """Policy names best first (lowest ``key``); NaN/missing values rank last, ties by name."""

    def sort_key(name: str) -> tuple[float, str]:
        value = metrics[name].get(key)
        bad = not isinstance(value, int | float) or math.isnan(value)
        return (math.inf if bad else float(value), name)

    return sorted(metrics, key=sort_key)


def kendall_tau(order_a: Sequence[str], order_b: Sequence[str]) -> float:
    """Kendall's tau-a between two orderings of the same items: 1 same order, -1 reversed.

    Raises ``ValueError`` if the orderings are not of the same set of items.
    """
    if sorted(order_a) != sorted(order_b) or len(set(order_a)) != len(order_a):
        raise ValueError("both orderings must list the same distinct items")
    n = len(order_a)
    if n < 2:
        return 1.0
    pos_b = {item: i for i, item in enumerate(order_b)}
    concordant = 0
    discordant = 0
    for x, y in combinations(order_a, 2):  # x before y in order_a
        if pos_b[x] < pos_b[y]:
            concordant += 1
        else:
            discordant += 1
    return (concordant - discordant) / (n * (n - 1) / 2)


def compare_rankings(
    sim: Mapping[str, Mapping[str, Any]], live: Mapping[str, Mapping[str, Any]], key: str = "mean_ttft_ms"
) -> dict[str, Any]:
    """Rankings of the policies both measured, Kendall tau, and whether the best policy agrees."""
    common = [name for name in live if name in sim]
    sim_order = rank_policies({n: sim[n] for n in common}, key)
    live_order = rank_policies({n: live[n] for n in common}, key)
    return {
        "key": key,
        "sim_order": sim_order,
        "live_order": live_order,
        "kendall_tau": kendall_tau(sim_order, live_order) if common else math.nan,
        "same_order": sim_order == live_order,
        "same_best": bool(common) and sim_order[0] == live_order[0],
    }
