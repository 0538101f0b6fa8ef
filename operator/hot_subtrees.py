"""Hot prefix subtrees of the fleet, merged from the workers' published cache summaries.

Every sidecar publishes a :class:`~prefixfleet.router.summary.Summary`: the chained block hashes of
everything its engine holds plus its top-K hot nodes ``HotNode(hash, tokens, hits, last_access)``,
where ``hits`` is a counter of requests that went through the node on that worker. The fleet view
per hashed node is:

* **rate** — an exponentially decayed rate of the hit-counter increments between two observations,
  summed over the workers that report the node. A counter that went *down* was reset (the node was
  evicted and cached again, or the sidecar restarted): its whole new value counts as the increment.
  A counter seen for the first time (a node entering a worker's top-K, a worker first observed)
  counts whole only if the worker's last block set shows the node was cached since; otherwise only
  its growth from then on counts (``_cached_since``);
* **tokens** — the prefix length at the node (what a miss on it costs to recompute);
* **holders** — the workers whose block set contains the node's hash (``Summary.has_block``), which
  includes workers that hold the prefix but do not rank it in their own top-K.

Sorted by value = rate × tokens (prefill seconds per second the fleet saves by keeping it cached).

:func:`find_prefix` goes the other way, inside the one process that has the tokens: given a block
hash, walk a worker's radix tree computing the same chained hashes the summary builder does and
return the prefix's tokens — what a pre-warm request for that subtree sends.

Pure functions over plain data; the state between rounds is returned and passed back in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from prefixfleet.router.blockhash import extend_chain
from prefixfleet.router.radix import TOKEN_BYTES, RadixNode, RadixTree
from prefixfleet.router.summary import HotPrefix, Summary

from .autoscale import SubtreeObservation

DEFAULT_HALF_LIFE_S = 15.0
DEFAULT_MIN_RATE_RPS = 0.01  # below this a subtree is forgotten
DEFAULT_LIMIT = 64


def subtree_id(block_hash: int) -> str:
    """The id a subtree goes by outside the sidecar: its block hash as 16 hex digits."""
    return f"{block_hash:016x}"


def parse_subtree_id(sid: str) -> int:
    # fullmatch, not int(sid, 16) alone: that also reads '0x...', '+...', ' ...' and '_' separators
    if not _SUBTREE_ID.fullmatch(sid):
        raise ValueError(f"subtree id must be 16 hex digits, got {sid!r}")
    return int(sid, 16)


_SUBTREE_ID = re.compile(r"[0-9a-fA-F]{16}")


@dataclass(frozen=True, slots=True)
class HotState:
    """What hot-subtree detection remembers between observations."""

    observed_s: float
    hits: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (worker, hash) -> counter
    rates: Mapping[int, float] = field(default_factory=dict)  # hash -> decayed requests/s
    tokens: Mapping[int, int] = field(default_factory=dict)  # hash -> prefix length
    # worker -> its summary at its last observation: which hashes it held then (see hot_subtrees)
    held: Mapping[str, Summary] = field(default_factory=dict)


def hot_subtrees(
    summaries: Mapping[str, Summary],
    previous: HotState | None,
    now: float,
    *,
    workers: Collection[str] | None = None,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    min_rate_rps: float = DEFAULT_MIN_RATE_RPS,
    limit: int = DEFAULT_LIMIT,
) -> tuple[list[SubtreeObservation], HotState]:
    """Merge per-worker summaries (worker id -> summary) into the fleet's hot subtrees.

    The first observation (``previous`` None) only records the counters: a rate needs two points.
    Returns at most ``limit`` subtrees, most valuable first, and the state for the next round.

    ``workers`` are the workers there are now, whose summaries may be missing this round (expired
    while their sidecar could not reach Redis, or not yet written again after a Redis restart): their
    counters are kept, so that when their summaries are back the hits counted before are not counted
    again as new (a counter of an hour's hits read as one round's: a rate ~100 times too high). A
    worker not among them is forgotten; None: every worker without a summary this round is (when
    it is back, its counters are a first sight: recorded, not counted).
    """
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    hits: dict[tuple[str, int], int] = {}
    increments: dict[int, int] = {}
    tokens: dict[int, int] = {}
    for worker, summary in summaries.items():
        for node in summary.hot:
            key = (worker, node.hash)
            if key in hits:  # the same hash twice in one summary: keep the larger counter
                hits[key] = max(hits[key], node.hits)
                continue
            hits[key] = node.hits
            tokens[node.hash] = max(tokens.get(node.hash, 0), node.tokens)
    held = dict(summaries)
    if previous is not None:
        for (worker, h), count in hits.items():
            before = previous.hits.get((worker, h))
            if before is not None:
                delta = count if count < before else count - before
            else:
                delta = count if _cached_since(previous.held.get(worker), h) else 0
            increments[h] = increments.get(h, 0) + delta
        # Counters of nodes a worker stopped ranking but still holds: kept, so a return to its
        # top-K is not counted twice. Gone from its cache means the counter restarts anyway. Those
        # of a worker whose summary is missing this round are kept too while it is there.
        for (worker, h), count in previous.hits.items():
            if (worker, h) in hits:
                continue
            if worker in summaries:
                if summaries[worker].has_block(h):
                    hits[(worker, h)] = count
            elif workers is not None and worker in workers:
                hits[(worker, h)] = count
        for worker, then in previous.held.items():
            if worker not in held and workers is not None and worker in workers:
                held[worker] = then

    dt = now - previous.observed_s if previous is not None else 0.0
    rates: dict[int, float] = {}
    if previous is not None and dt > 0:
        keep = math.exp(-dt * math.log(2) / half_life_s)
        for h in set(previous.rates) | set(increments):
            instant = increments.get(h, 0) / dt
            rates[h] = keep * previous.rates.get(h, 0.0) + (1.0 - keep) * instant
    elif previous is not None:  # two observations at the same instant: nothing new to learn
        rates = dict(previous.rates)
    for h in list(rates):
        if h not in tokens:
            if h in previous.tokens:  # type: ignore[union-attr]
                tokens[h] = previous.tokens[h]  # type: ignore[union-attr]
            else:
                del rates[h]
                continue
        if rates[h] < min_rate_rps:
            del rates[h]
    live = set(rates)
    tokens = {h: t for h, t in tokens.items() if h in live}

    ranked = sorted(live, key=lambda h: (rates[h] * tokens[h], h), reverse=True)[:limit]
    observations = [
        SubtreeObservation(
            subtree_id=subtree_id(h),
            tokens=tokens[h],
            rate_rps=rates[h],
            holders=frozenset(w for w, s in summaries.items() if s.has_block(h)),
        )
        for h in ranked
    ]
    return observations, HotState(observed_s=now, hits=hits, rates=rates, tokens=tokens, held=held)


def _cached_since(then: Summary | None, block_hash: int) -> bool:
    """Whether a node that a worker publishes with no earlier counter of ours was cached there since
    ``then``, the worker's summary at its last observation: if so its whole counter is new hits.

    A summary's ``hits`` is the node's lifetime counter (no decay) and lists only the top K nodes, so
    a counter seen for the first time covers an unknown past: a node held all along enters a
    worker's top-K when it overtakes another, with every hit since it was cached. Counted as one
    round's, a node with 1002 lifetime hits that gained 1 in 5 s read ~41 requests/s. Nothing in the
    summary dates a counter's start (``last_access`` is the last hit only, and the simulator stamps
    every node with the build time; ``version`` counts publications, not seconds), but the block
    set does: a hash the worker did not hold at its last observation was cached since, so its
    counter started then. Otherwise (held then, or a worker not observed before: a new pod's
    first summary, a worker whose summary the caller did not keep) the counter is recorded and only
    its growth counts, from the next round. That undercounts at most one round of one worker's
    hits; counting the whole counter can overcount by hours of them. A truncated block set (capped)
    cannot tell "not held", so it counts as held.
    """
    return then is not None and not then.truncated and not then.has_block(block_hash)


def find_prefix(
    tree: RadixTree,
    block_hash: int,
    *,
    block_tokens: int,
    namespace_seed: Callable[[object], int],
) -> HotPrefix | None:
    """The cached prefix of ``tree`` whose last full block hashes to ``block_hash``, or None.

    Hashes exactly as :func:`prefixfleet.router.summary.build_summary` does (per namespace, chained
    from ``namespace_seed(ns)``), so any hash a summary published from this tree is found.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    for ns in tree.namespaces():
        root = tree.root(ns)
        seed = namespace_seed(ns)
        stack: list[tuple[RadixNode, int, bytes, int]] = [(c, seed, b"", 0) for c in root.children.values()]
        while stack:
            node, prev_hash, leftover, start = stack.pop()
            hashes, rest = extend_chain(prev_hash, leftover, node.edge, block_tokens)
            if block_hash in hashes:
                first_block = (start - len(leftover) // TOKEN_BYTES) // block_tokens
                end_tokens = (first_block + hashes.index(block_hash) + 1) * block_tokens
                return HotPrefix(ns, _path_bytes(node)[: end_tokens * TOKEN_BYTES])
            last = hashes[-1] if hashes else prev_hash
            end = start + node.num_tokens
            stack.extend((c, last, rest, end) for c in node.children.values())
    return None


def _path_bytes(node: RadixNode) -> bytes:
    parts: list[bytes] = []
    cur: RadixNode | None = node
    while cur is not None and cur.parent is not None:
        parts.append(cur.edge)
        cur = cur.parent
    return b"".join(reversed(parts))
