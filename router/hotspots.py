"""Where the fleet's hottest prefix subtrees live, from the workers' summaries (pure).

Each summary names its worker's top hot nodes by chained block hash, so the same prefix has the same
hash on every worker that serves the same cache identity. Grouping the nodes by hash across
summaries tells, for the fleet's K hottest subtrees, how many workers hold each one and how its hits
split between them: a hot subtree held by a single saturated worker is the hotspot the autoscaler
and the dashboard look for. The result is ranked, so metrics can label by rank (1..K), never by hash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .summary import Summary

DEFAULT_TOP_SUBTREES = 8


@dataclass(frozen=True, slots=True)
class HotSubtree:
    rank: int  # 1 = hottest
    tokens: int  # prefix length at the subtree's root
    hits: int  # hits recorded at the root, summed over its holders
    holders: tuple[tuple[str, int], ...]  # (worker, hits there), most hits first


def rank_hot_subtrees(summaries: Iterable[Summary], k: int = DEFAULT_TOP_SUBTREES) -> list[HotSubtree]:
    """The ``k`` subtrees with the most hits fleet-wide; ties broken by longer prefix, then hash."""
    tokens: dict[int, int] = {}
    per_worker: dict[int, dict[str, int]] = {}
    for summary in summaries:
        for node in summary.hot:
            tokens[node.hash] = max(tokens.get(node.hash, 0), node.tokens)
            holders = per_worker.setdefault(node.hash, {})
            holders[summary.worker] = holders.get(summary.worker, 0) + node.hits
    ordered = sorted(per_worker, key=lambda h: (-sum(per_worker[h].values()), -tokens[h], h))
    return [
        HotSubtree(
            rank=i,
            tokens=tokens[h],
            hits=sum(per_worker[h].values()),
            holders=tuple(sorted(per_worker[h].items(), key=lambda kv: (-kv[1], kv[0]))),
        )
        for i, h in enumerate(ordered[:k], start=1)
    ]
