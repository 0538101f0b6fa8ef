"""Our own implementation of the seed lab's routing model, to reproduce its published comparison.

The lab's model (not a discrete-event queue): before each arrival every replica's ``queue_wait``
drains by a fixed 14 ms (floored at 0); the chosen replica's queue grows by the request's execution
time ``matched × cached_lookup + unmatched × prefill``; TTFT = queue_wait + exec. It rounds as it
goes (exec and queue to 4 decimals, TTFT to 2), and — unlike our routers, which probe without
touching — its prefix lookup refreshes LRU recency on *every* probe, so probing all replicas changes
what they evict next. We call ``RadixTree.match_prefix(touch=True)`` wherever the lab probes.

Policies, with the lab's exact rules:
* ``round_robin`` — rotate.
* ``pure_affinity`` — longest match, ties to the lowest id; no match anywhere → ``tokens[0] % N``.
* ``cache_aware`` — argmin of queue_wait + estimated exec, ties to the lowest id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixfleet.router.radix import RadixTree

from .workloads import lab_burst_token_lists

LAB_POLICIES = ("round_robin", "pure_affinity", "cache_aware")


@dataclass(frozen=True, slots=True)
class LabSettings:
    replicas: int = 4
    cache_tokens: int = 9216
    prefill_ms_per_token: float = 0.025
    cached_lookup_ms_per_token: float = 0.0015
    queue_decay_ms_per_arrival: float = 14.0


@dataclass(slots=True)
class LabReplica:
    replica_id: int
    tree: RadixTree
    queue_wait_ms: float = 0.0
    routed_requests: int = 0
    matched_tokens_total: int = 0
    computed_tokens_total: int = 0


@dataclass(slots=True)
class LabFleet:
    settings: LabSettings
    replicas: list[LabReplica] = field(default_factory=list)
    cursor: int = 0

    @classmethod
    def build(cls, settings: LabSettings) -> LabFleet:
        reps = [LabReplica(i, RadixTree(settings.cache_tokens)) for i in range(settings.replicas)]
        return cls(settings, reps)

    def exec_ms(self, total: int, matched: int) -> float:
        s = self.settings
        return round(matched * s.cached_lookup_ms_per_token + (total - matched) * s.prefill_ms_per_token, 4)

    def probe(self, rep: LabReplica, tokens: Sequence[int]) -> int:
        return rep.tree.match_prefix(tokens, touch=True).matched_tokens

    def choose(self, tokens: Sequence[int], policy: str) -> LabReplica:
        reps = self.replicas
        if policy == "round_robin":
            chosen = reps[self.cursor % len(reps)]
            self.cursor += 1
            return chosen
        if policy == "pure_affinity":
            best, best_len = reps[0], -1
            for rep in reps:  # every replica is probed (and touched), in id order
                n = self.probe(rep, tokens)
                if n > best_len:
                    best, best_len = rep, n
            return best if best_len > 0 else reps[tokens[0] % len(reps)]
        if policy == "cache_aware":
            scored = [
                (
                    round(rep.queue_wait_ms + self.exec_ms(len(tokens), self.probe(rep, tokens)), 4),
                    rep.replica_id,
                )
                for rep in reps
            ]
            return reps[min(scored)[1]]
        raise ValueError(f"unknown lab policy {policy!r}; choose from {', '.join(LAB_POLICIES)}")

    def route(self, tokens: Sequence[int], policy: str) -> float:
        """Route one request; returns its TTFT in ms (rounded to 0.01 as the lab does)."""
        decay = self.settings.queue_decay_ms_per_arrival
        for rep in self.replicas:
            rep.queue_wait_ms = max(0.0, round(rep.queue_wait_ms - decay, 4))
        chosen = self.choose(tokens, policy)
        matched = self.probe(chosen, tokens)
        exec_ms = self.exec_ms(len(tokens), matched)
        ttft = round(chosen.queue_wait_ms + exec_ms, 2)
        chosen.tree.insert(tokens)
        chosen.queue_wait_ms = round(chosen.queue_wait_ms + exec_ms, 4)
        chosen.routed_requests += 1
        chosen.matched_tokens_total += matched
        chosen.computed_tokens_total += len(tokens) - matched
        return ttft


def run_lab_policy(policy: str, prompts: Sequence[Sequence[int]], settings: LabSettings) -> dict[str, Any]:
    fleet = LabFleet.build(settings)
    ttfts = [fleet.route(p, policy) for p in prompts]
    matched = sum(r.matched_tokens_total for r in fleet.replicas)
    computed = sum(r.computed_tokens_total for r in fleet.replicas)
    return {
        "policy": policy,
        "total_requests": len(prompts),
        "cache_hit_ratio": round(matched / (matched + computed), 4),
        "mean_ttft_ms": round(sum(ttfts) / len(ttfts), 2),
        "max_ttft_ms": round(max(ttfts), 2),
        "max_replica_requests": max(r.routed_requests for r in fleet.replicas),
        "min_replica_requests": min(r.routed_requests for r in fleet.replicas),
        "total_evicted_tokens": sum(r.tree.evicted_tokens_total for r in fleet.replicas),
        "replica_loads": [
            {
                "replica_id": r.replica_id,
                "routed_requests": r.routed_requests,
                "cached_tokens": r.tree.cached_tokens,
                "evicted_tokens": r.tree.evicted_tokens_total,
            }
            for r in fleet.replicas
        ],
    }


def reproduce_lab(settings: LabSettings | None = None) -> dict[str, Any]:
    """The lab's comparison on its burst workload, in the lab's JSON shape."""
    settings = settings or LabSettings()
    prompts = lab_burst_token_lists()
    return {
        "execution_mode": "prefixfleet re-implementation of the seed lab's routing model",
        "workload_requests": len(prompts),
        "hot_prefix_tokens": 4096,
        "user_turn_tokens": 256,
        "settings": {
            "replicas": settings.replicas,
            "max_cached_tokens_per_replica": settings.cache_tokens,
            "prefill_ms_per_token": settings.prefill_ms_per_token,
            "cached_lookup_ms_per_token": settings.cached_lookup_ms_per_token,
            "queue_decay_ms_per_arrival": settings.queue_decay_ms_per_arrival,
        },
        "policies": {p: run_lab_policy(p, prompts, settings) for p in LAB_POLICIES},
    }
