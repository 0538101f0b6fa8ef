"""queue_aware charges eviction only for what a choice could avoid writing.

When some replica holds part of the prompt, the suffix nobody holds is written wherever the request
goes; only the overflow of tokens that copy what another replica already holds is charged. Charging
the suffix by each replica's turnover steered a hot tenant's short hits between its holders by churn
instead of by queue (docs/policies.md). A prompt nobody holds any of is still charged on all its
overflow: where it lands decides whose content it evicts.
"""

from __future__ import annotations

import pytest

from prefixfleet.router.policies import CostModel, Decision, ReplicaState, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes

COST = CostModel(prefill_s_per_token=0.001)


def _req(n: int, start: int = 0, now: float = 60.0) -> RouteRequest:
    return RouteRequest(as_token_bytes(range(start, start + n)), n, now=now)


def _full(rid: int, matched: int = 0, wait: float = 0.0) -> ReplicaState:
    return ReplicaState(rid, matched_tokens=matched, wait_s=wait, cached_tokens=1000, capacity_tokens=1000)


def _policy():
    """queue_aware with only the eviction charge; replica 0's cache turns over in ~1 s, replica 1's in
    ~100 s (a minute of cold requests at 1000 and 10 new tokens/s into 1000-token caches)."""
    p = make_policy("queue_aware", COST, delay_weight=0.0, congestion_weight=0.0, eviction_weight=5.0)
    for i in range(600):
        now = i * 0.1
        p.on_routed(_req(100, start=10_000 * i, now=now), Decision(0, "no_match", 0))
        p.on_routed(_req(1, start=10_000 * i + 5000, now=now), Decision(1, "no_match", 0))
    return p


def test_a_hit_goes_to_the_holder_with_the_shorter_queue_whatever_its_churn():
    p = _policy()
    fast = p.eviction_cost_per_token(_full(0), 60.0)
    slow = p.eviction_cost_per_token(_full(1), 60.0)
    assert fast > 5 * slow  # the two caches' charges differ widely
    # both hold 90 of the 100 tokens; each must write the 10-token suffix, so neither is charged
    busy_slow, quick_fast = _full(1, matched=90, wait=0.03), _full(0, matched=90, wait=0.01)
    assert p.score(_req(100), quick_fast, best_match=90) == pytest.approx(0.01 + 0.01)
    assert p.score(_req(100), busy_slow, best_match=90) == pytest.approx(0.03 + 0.01)
    # before, the suffix's overflow cost 10 x 4.5 ms on the fast-churning holder and sent the hit to
    # the slower queue
    d = p.choose(_req(100), [busy_slow, quick_fast])
    assert (d.replica_id, d.reason) == (0, "cache_hit")


def test_copying_a_prefix_another_replica_holds_is_still_charged():
    p = _policy()
    per_token = p.eviction_cost_per_token(_full(0), 60.0)
    # replica 0 holds nothing of a prompt whose first 90 tokens replica 1 holds: 90 copied tokens
    # are charged, not the 10 the request writes wherever it goes
    assert p.score(_req(100), _full(0), best_match=90) == pytest.approx(0.1 + 90 * per_token)
    # a partial holder pays for the part it would copy (90 - 50)
    assert p.score(_req(100), _full(0, matched=50), best_match=90) == pytest.approx(0.05 + 40 * per_token)
    # so a holder with a 0.2 s queue still beats the idle fast-churning replica (0.1 + 0.4 s)
    d = p.choose(_req(100), [_full(0), _full(1, matched=90, wait=0.2)])
    assert (d.replica_id, d.reason) == (1, "cache_hit")


def test_a_prompt_nobody_holds_is_charged_on_all_its_overflow():
    p = _policy()
    per_token = p.eviction_cost_per_token(_full(0), 60.0)
    assert p.score(_req(100), _full(0), best_match=0) == pytest.approx(0.1 + 100 * per_token)
    assert p.score(_req(100), _full(0)) == p.score(_req(100), _full(0), best_match=0)
    # it goes to the cache whose tail is stale, though that replica's queue is longer
    d = p.choose(_req(100), [_full(0), _full(1, wait=0.05)])
    assert (d.replica_id, d.reason) == (1, "no_match")
