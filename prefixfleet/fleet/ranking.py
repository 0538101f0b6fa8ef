"""Do two measurements rank routing policies the same way? (simulator vs live fleet)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np


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


# -- tie-aware comparison: which differences can a measurement actually resolve? ------------------


def paired_order(
    a_ms: Sequence[float],
    b_ms: Sequence[float],
    *,
    blocks: int = 20,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> int:
    """-1 if ``a`` has the lower mean, +1 if ``b`` has, 0 if the measurement cannot tell.

    ``a_ms[i]`` and ``b_ms[i]`` are the same request under two policies (NaN where one failed), so
    the differences are paired. Requests close in time share queues, so they are resampled in
    contiguous blocks (moving-block bootstrap): resampling single requests would treat a queue
    build-up as many independent observations and call noise a difference.
    """
    if len(a_ms) != len(b_ms):
        raise ValueError("paired samples must have the same length")
    d = np.asarray(a_ms, dtype=float) - np.asarray(b_ms, dtype=float)
    d = d[~np.isnan(d)]
    if d.size < 2 * blocks:
        return 0
    size = d.size // blocks
    starts_max = d.size - size + 1
    # Mean of each possible block, then means of `blocks` blocks drawn with replacement.
    csum = np.concatenate(([0.0], np.cumsum(d)))
    block_means = (csum[size:] - csum[:-size])[:starts_max] / size
    rng = np.random.default_rng(seed)
    draws = block_means[rng.integers(0, starts_max, size=(resamples, blocks))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(draws, [tail, 1.0 - tail])
    if hi < 0:
        return -1
    if lo > 0:
        return 1
    return 0


def pairwise_orders(ttfts_ms: Mapping[str, Sequence[float]]) -> dict[tuple[str, str], int]:
    """``paired_order`` for every pair of policies (names in sorted order)."""
    names = sorted(ttfts_ms)
    return {(x, y): paired_order(ttfts_ms[x], ttfts_ms[y]) for x, y in combinations(names, 2)}


def tiers(
    metrics: Mapping[str, Mapping[str, Any]], orders: Mapping[tuple[str, str], int], key: str
) -> list[list[str]]:
    """Policies best first, grouped: a policy joins the current group unless it is resolvably worse
    than the group's first member."""
    out: list[list[str]] = []
    for name in rank_policies(metrics, key):
        if out:
            head = out[-1][0]
            pair = (head, name) if head < name else (name, head)
            worse = orders.get(pair, 0) == (-1 if head < name else 1)
            if not worse:
                out[-1].append(name)
                continue
        out.append([name])
    return out


def compare_resolved(
    sim_ttfts_ms: Mapping[str, Sequence[float]],
    live_ttfts_ms: Mapping[str, Sequence[float]],
    sim: Mapping[str, Mapping[str, Any]],
    live: Mapping[str, Mapping[str, Any]],
    key: str = "mean_ttft_ms",
) -> dict[str, Any]:
    """Sim vs live, pair by pair, counting only differences each measurement resolves.

    A pair ordered one way by one and the other way by the other is a *contradiction*; a pair one of
    them cannot resolve (its bootstrap interval holds 0) is *unresolved* there. They agree when
    there is no contradiction.
    """
    common = sorted(n for n in live_ttfts_ms if n in sim_ttfts_ms)
    sim_orders = pairwise_orders({n: sim_ttfts_ms[n] for n in common})
    live_orders = pairwise_orders({n: live_ttfts_ms[n] for n in common})
    confirmed, contradictions, unresolved = [], [], []
    for pair in sim_orders:
        s, v = sim_orders[pair], live_orders[pair]
        if s and v:
            (confirmed if s == v else contradictions).append(list(pair))
        else:
            unresolved.append(list(pair))
    return {
        "method": "paired moving-block bootstrap of per-request TTFT differences, 20 blocks, 95% interval",
        "sim_tiers": tiers({n: sim[n] for n in common}, sim_orders, key),
        "live_tiers": tiers({n: live[n] for n in common}, live_orders, key),
        "confirmed_pairs": confirmed,
        "contradicting_pairs": contradictions,
        "unresolved_pairs": unresolved,
        "agree": not contradictions,
    }
