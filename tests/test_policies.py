"""Routing policies as specifications: each rule, on plain data."""

from __future__ import annotations

import math

import pytest

from prefixfleet.router.policies import (
    DEFAULT_POLICY,
    POLICIES,
    CostModel,
    Decision,
    NoReplicaError,
    ReplicaState,
    RouteRequest,
    make_policy,
)
from prefixfleet.router.radix import as_token_bytes

COST = CostModel(prefill_s_per_token=0.001)


def req(n: int = 100, start: int = 0, now: float = 0.0) -> RouteRequest:
    return RouteRequest(as_token_bytes(range(start, start + n)), n, now=now)


def rep(rid: int, matched: int = 0, wait: float = 0.0, in_flight: int = 0, **kw) -> ReplicaState:
    return ReplicaState(rid, matched_tokens=matched, wait_s=wait, in_flight=in_flight, **kw)


def test_registry_has_every_policy_and_default():
    assert set(POLICIES) == {
        "round_robin",
        "least_loaded",
        "affinity",
        "affinity_balanced",
        "sglang_cache_aware",
        "preble_e2",
        "queue_aware",
    }
    assert DEFAULT_POLICY in POLICIES


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown routing policy 'nope'"):
        make_policy("nope")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_skips_unhealthy_and_refuses_empty_fleet(name):
    policy = make_policy(name, COST)
    sick = ReplicaState(0, matched_tokens=100, healthy=False)
    ok = rep(1)
    for _ in range(3):
        d = policy.choose(req(), [sick, ok])
        assert d.replica_id == 1
        assert d.reason in policy.reasons
        policy.on_routed(req(), d)
    with pytest.raises(NoReplicaError):
        policy.choose(req(), [sick])


def test_round_robin_rotates():
    p = make_policy("round_robin", COST)
    picks = [p.choose(req(), [rep(0), rep(1), rep(2)]).replica_id for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]


def test_least_loaded_takes_shortest_wait():
    p = make_policy("least_loaded", COST)
    assert p.choose(req(), [rep(0, wait=0.3), rep(1, wait=0.1), rep(2, wait=0.2)]).replica_id == 1


def test_affinity_ignores_load():
    p = make_policy("affinity", COST)
    d = p.choose(req(), [rep(0, matched=10), rep(1, matched=90, wait=100.0)])
    assert (d.replica_id, d.reason) == (1, "cache_hit")


def test_affinity_is_stable_for_a_new_prefix():
    p = make_policy("affinity", COST)
    fleet = [rep(0), rep(1), rep(2), rep(3)]
    assert len({p.choose(req(start=7), fleet).replica_id for _ in range(5)}) == 1


def test_affinity_balanced_falls_back_beyond_slack():
    p = make_policy("affinity_balanced", COST, load_slack_s=0.05)
    assert p.choose(req(), [rep(0, matched=90, wait=0.04), rep(1)]).replica_id == 0
    d = p.choose(req(), [rep(0, matched=90, wait=0.06), rep(1)])
    assert (d.replica_id, d.reason) == (1, "load_guard")


def test_sglang_routes_to_owner_of_cached_text_above_threshold():
    p = make_policy("sglang_cache_aware", COST)
    fleet = [rep(0), rep(1), rep(2)]
    first = p.choose(req(100), fleet)
    p.on_routed(req(100), first)
    # 100 of 120 tokens known under the first worker: match rate 0.83 > 0.3 -> same worker
    again = p.choose(req(120), fleet)
    assert (again.replica_id, again.reason) == (first.replica_id, "cache_hit")
    # a different prompt has no match: least-loaded worker
    busy = [rep(0, in_flight=3), rep(1, in_flight=1), rep(2, in_flight=2)]
    d = p.choose(req(50, start=10_000), busy)
    assert (d.replica_id, d.reason) == (1, "low_match")


def test_sglang_imbalance_needs_both_thresholds():
    p = make_policy("sglang_cache_aware", COST)
    fleet = [rep(0), rep(1)]
    p.on_routed(req(), p.choose(req(), fleet))
    owner = p.choose(req(), fleet).replica_id
    other = 1 - owner
    # abs gap 65 > 64 and 100 > 35*1.5 -> imbalanced -> least loaded even though owner has the text
    loads = {owner: 100, other: 35}
    d = p.choose(req(), [rep(i, in_flight=loads[i]) for i in (0, 1)])
    assert (d.replica_id, d.reason) == (other, "imbalanced")
    # a gap of 40 is under the absolute threshold: balanced, so the text's owner wins
    loads = {owner: 140, other: 100}
    d = p.choose(req(), [rep(i, in_flight=loads[i]) for i in (0, 1)])
    assert (d.replica_id, d.reason) == (owner, "cache_hit")


def test_preble_exploits_when_cached_part_dominates_and_explores_otherwise():
    p = make_policy("preble_e2", COST)
    d = p.choose(req(100), [rep(0, matched=80, wait=0.01), rep(1)])
    assert (d.replica_id, d.reason) == (0, "exploit")
    d = p.choose(req(100), [rep(0, matched=30, wait=0.2), rep(1)])
    assert (d.replica_id, d.reason) == (1, "explore")


def test_preble_replicates_an_overloaded_hot_prefix():
    p = make_policy("preble_e2", COST)
    # holder's TTFT 1.0+0.02 > 2x the cold replica's 0.1
    d = p.choose(req(100), [rep(0, matched=80, wait=1.0), rep(1)])
    assert (d.replica_id, d.reason) == (1, "replicate")


def test_queue_aware_weighs_saved_prefill_against_wait():
    p = make_policy("queue_aware", COST, delay_weight=0.0, eviction_weight=0.0, congestion_weight=0.0)
    # hit saves 0.09 s of prefill; a 0.05 s longer queue is worth it, a 0.2 s one is not
    assert p.choose(req(100), [rep(0, matched=90, wait=0.05), rep(1)]).replica_id == 0
    d = p.choose(req(100), [rep(0, matched=90, wait=0.2), rep(1)])
    assert (d.replica_id, d.reason) == (1, "load_balance")


def test_queue_aware_externality_prefers_less_total_work():
    kw = {"delay_weight": 0.0, "eviction_weight": 0.0, "congestion_weight": 0.0}
    greedy = make_policy("queue_aware", COST, externality=0.0, **kw)
    frugal = make_policy("queue_aware", COST, externality=1.0, **kw)
    fleet = [rep(0, matched=90, wait=0.1), rep(1)]
    # greedy: 0.1+0.01=0.11 vs 0.1 -> cold replica; with externality the miss costs 0.2 -> hit
    assert greedy.choose(req(100), fleet).replica_id == 1
    assert frugal.choose(req(100), fleet).replica_id == 0


def test_queue_aware_keeps_a_long_miss_off_a_busy_stream():
    p = make_policy("queue_aware", COST, delay_weight=1.0, eviction_weight=0.0, congestion_weight=0.0)
    # replica 0 has been receiving 20 requests/s; replica 1 nothing. Both idle right now.
    for i in range(200):
        p.on_routed(req(10, start=50_000, now=i * 0.05), Decision(0, "cache_hit", 10))
    now = 10.0
    d = p.choose(req(500, start=90_000, now=now), [rep(0, wait=0.0), rep(1, wait=0.05)])
    # own TTFT alone would pick 0 (0.5 s vs 0.55 s); the 0.5 s it would block 20 req/s decides
    assert d.replica_id == 1
    assert p.arrival_rate(0, now) > 10 > p.arrival_rate(1, now)


def test_queue_aware_prefers_hits_harder_when_every_queue_is_long():
    p = make_policy("queue_aware", COST, delay_weight=0.0, eviction_weight=0.0, congestion_weight=3.0)
    # slack in the fleet: the cold replica answers sooner (0.1 s vs 0.15 s) and wins
    assert p.choose(req(100), [rep(0, matched=90, wait=0.14), rep(1)]).replica_id == 1
    # every queue is long (the idle-most waits 0.5 s = 5x a cold prefill): the miss's 90 extra
    # tokens of work now cost more than the holder's longer queue
    d = p.choose(req(100), [rep(0, matched=90, wait=0.64), rep(1, wait=0.5)])
    assert (d.replica_id, d.reason) == (0, "cache_hit")


def _churn(p, replica: int, tokens_per_s: float, seconds: float = 60.0) -> None:
    """Feed ``p`` a minute of cold requests sent to ``replica`` (its rates decay over a 10 s window)."""
    for i in range(int(seconds * 10)):
        p.on_routed(
            req(int(tokens_per_s / 10), start=10_000 * i, now=i * 0.1), Decision(replica, "no_match", 0)
        )


def test_queue_aware_charges_evicting_a_full_cache_that_turns_over_fast():
    p = make_policy("queue_aware", COST, delay_weight=0.0, eviction_weight=1.0, congestion_weight=0.0)
    # 1000 new tokens/s through a 1000-token cache: what it evicts was used about a second ago
    _churn(p, 0, tokens_per_s=1000)
    full = rep(0, wait=0.0, cached_tokens=1000, capacity_tokens=1000)
    roomy = rep(1, wait=0.05, cached_tokens=0, capacity_tokens=1000)
    assert p.turnover_s(full, 60.0) == pytest.approx(1.0, rel=0.1)
    assert p.choose(req(100, now=60.0), [full, roomy]).replica_id == 1


def test_queue_aware_evicts_stale_content_nearly_for_free():
    p = make_policy("queue_aware", COST, delay_weight=0.0, eviction_weight=1.0, congestion_weight=0.0)
    # 10 new tokens/s through a 100k-token cache: its LRU tail is hours old
    _churn(p, 0, tokens_per_s=10)
    full = rep(0, wait=0.0, cached_tokens=100_000, capacity_tokens=100_000)
    roomy = rep(1, wait=0.05, cached_tokens=0, capacity_tokens=100_000)
    assert p.choose(req(100, now=60.0), [full, roomy]).replica_id == 0
    # a cache the policy has never sent anything to has no recent content of its tenants to lose
    assert p.eviction_cost_per_token(rep(1, capacity_tokens=1000), 60.0) == 0.0


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("affinity_balanced", {"load_slack_s": -1}),
        ("sglang_cache_aware", {"cache_threshold": 2}),
        ("preble_e2", {"replicate_factor": 0.5}),
        ("queue_aware", {"externality": -1}),
        ("queue_aware", {"window_s": 0}),
        ("queue_aware", {"congestion_weight": -1}),
    ],
)
def test_bad_policy_parameters_are_refused(name, params):
    with pytest.raises(ValueError):
        make_policy(name, COST, **params)


# -- rules the examples above left open (each found by breaking the rule and seeing no test fail) --

# 2**-10 s a token: sums of whole multiples are exact in binary floating point, so a score tie is
# a real tie and the tie-break rule decides.
EXACT = CostModel(prefill_s_per_token=2**-10)


def test_affinity_sends_a_prefix_nobody_holds_by_its_first_16_tokens():
    p = make_policy("affinity", COST)
    fleet = [rep(0), rep(1), rep(2), rep(3)]
    head = list(range(16))
    # same 16-token head, different tails: one replica, and nothing is expected to be cached there
    decisions = [p.choose(RouteRequest(as_token_bytes(head + [1000 + i] * 30), 46), fleet) for i in range(20)]
    assert {(d.replica_id, d.reason, d.expected_matched_tokens) for d in decisions} == {
        (decisions[0].replica_id, "no_match", 0)
    }
    # different heads spread: new prefixes are not all piled onto one replica
    assert len({p.choose(req(100, start=1000 * i), fleet).replica_id for i in range(20)}) > 1


def test_affinity_balanced_falls_back_to_the_shortest_wait_not_the_fewest_requests():
    p = make_policy("affinity_balanced", COST)
    d = p.choose(req(), [rep(0, wait=0.2, in_flight=1), rep(1, wait=0.1, in_flight=5)])
    assert (d.replica_id, d.reason) == (1, "no_match")


def test_affinity_balanced_measures_the_slack_against_the_least_loaded_replica():
    p = make_policy("affinity_balanced", COST, load_slack_s=0.05)
    # the holder waits 0.3 s, but the idlest replica waits 0.28 s: only 0.02 s more, keep the hit
    d = p.choose(req(), [rep(0, matched=90, wait=0.3), rep(1, wait=0.28)])
    assert (d.replica_id, d.reason) == (0, "cache_hit")


def test_affinity_balanced_breaks_a_match_tie_by_the_shorter_wait():
    p = make_policy("affinity_balanced", COST)
    d = p.choose(req(), [rep(0, matched=90, wait=0.03), rep(1, matched=90, wait=0.01)])
    assert (d.replica_id, d.reason) == (1, "cache_hit")


def test_least_loaded_breaks_a_wait_tie_by_fewer_requests_in_flight():
    p = make_policy("least_loaded", COST)
    assert p.choose(req(), [rep(0, wait=0.1, in_flight=3), rep(1, wait=0.1, in_flight=1)]).replica_id == 1


def _sglang_with_owner(**params):
    """A cache_aware policy that has routed ``req(100)`` to replica 0 (the text's owner)."""
    p = make_policy("sglang_cache_aware", COST, **params)
    p.on_routed(req(100), Decision(0, "cache_hit", 0))
    return p


def test_sglang_imbalance_needs_the_relative_threshold_too():
    p = _sglang_with_owner()
    # gap 70 > 64, but 300 is not above 1.5 × 230: balanced, so the owner of the text wins
    d = p.choose(req(), [rep(0, in_flight=300), rep(1, in_flight=230)])
    assert (d.replica_id, d.reason) == (0, "cache_hit")


def test_sglang_a_match_rate_at_or_under_the_threshold_goes_to_the_least_loaded():
    p = _sglang_with_owner()
    fleet = [rep(0, in_flight=2), rep(1, in_flight=1)]
    # 100 of 400 tokens known: rate 0.25 <= 0.3
    assert (p.choose(req(400), fleet).replica_id, p.choose(req(400), fleet).reason) == (1, "low_match")
    # 100 of 300: rate 0.33 > 0.3
    assert (p.choose(req(300), fleet).replica_id, p.choose(req(300), fleet).reason) == (0, "cache_hit")


def test_sglang_trims_its_tree_every_eviction_interval():
    p = make_policy("sglang_cache_aware", COST, eviction_interval_s=120.0, max_tree_size=0)
    fleet = [rep(0), rep(1, in_flight=1)]
    p.choose(req(now=0.0), fleet)  # the first call schedules the first trim at t=120
    p.on_routed(req(now=0.0), Decision(0, "cache_hit", 0))
    assert p.choose(req(now=119.0), fleet).reason == "cache_hit"
    d = p.choose(req(now=121.0), fleet)  # trimmed to 0 tokens per worker: nothing is known any more
    assert (d.replica_id, d.reason) == (0, "low_match")


def test_sglang_forgets_a_removed_replica():
    p = _sglang_with_owner()
    p.on_replica_removed(0)
    # a replica that comes back under the same id has an empty cache
    d = p.choose(req(), [rep(0, in_flight=1), rep(1)])
    assert (d.replica_id, d.reason) == (1, "low_match")


def test_preble_explores_when_cached_and_uncached_parts_are_equal():
    p = make_policy("preble_e2", COST)
    # 50 cached, 50 not: exploit needs the uncached part *shorter*
    d = p.choose(req(100), [rep(0, matched=50, wait=0.01), rep(1)])
    assert d.reason == "explore"


def test_preble_exploits_the_least_loaded_holder():
    p = make_policy("preble_e2", COST)
    d = p.choose(req(100), [rep(0, matched=80, wait=0.05), rep(1, matched=80, wait=0.01), rep(2)])
    assert (d.replica_id, d.reason) == (1, "exploit")


def test_preble_explore_charges_recomputing_what_a_full_cache_evicts():
    p = make_policy("preble_e2", COST)
    # cold everywhere; replica 0 is idle but full: 100 evicted tokens cost 0.1 s -> 0.2 s vs 0.15 s
    full = rep(0, cached_tokens=1000, capacity_tokens=1000)
    roomy = rep(1, wait=0.05, cached_tokens=0, capacity_tokens=1000)
    d = p.choose(req(100), [full, roomy])
    assert (d.replica_id, d.reason) == (1, "explore")


def _quiet_queue_aware(cost: CostModel = COST, **params):
    kw = {"delay_weight": 0.0, "eviction_weight": 0.0, "congestion_weight": 0.0} | params
    return make_policy("queue_aware", cost, **kw)


def test_queue_aware_breaks_a_score_tie_towards_the_longer_match():
    p = _quiet_queue_aware(EXACT)
    # replica 0: 64/1024 s wait + 36 uncached tokens; replica 1: no wait + 100 uncached: both 100/1024 s
    cold, holder = rep(1), rep(0, matched=64, wait=64 * 2**-10)
    assert p.score(req(100), cold) == p.score(req(100), holder)
    d = p.choose(req(100), [cold, holder])
    assert (d.replica_id, d.reason, d.expected_matched_tokens) == (0, "cache_hit", 64)


def test_queue_aware_says_no_match_when_nobody_holds_any_of_the_prompt():
    d = _quiet_queue_aware().choose(req(100), [rep(0, wait=0.1), rep(1)])
    assert (d.replica_id, d.reason, d.expected_matched_tokens) == (1, "no_match", 0)


def test_queue_aware_head_of_line_charge_is_the_rate_times_prefill_times_mean_hold():
    p = _quiet_queue_aware(delay_weight=1.0)
    p.on_routed(req(10, now=0.0), Decision(0, "cache_hit", 10))  # one arrival: 1/10 s over the 10 s window
    assert p.arrival_rate(0, 0.0) == pytest.approx(0.1)
    # wait 0.5 + prefill 0.1 + 1 × 0.1/s × 0.1 s × (0.5 s + 0.1 s / 2) held
    assert p.score(req(100, now=0.0), rep(0, wait=0.5)) == pytest.approx(0.5 + 0.1 + 0.1 * 0.1 * 0.55)
    # the rate decays over the window: e^-1 of it is left 10 s later
    assert p.arrival_rate(0, 10.0) == pytest.approx(0.1 / math.e)


def test_queue_aware_congestion_is_the_idlest_wait_in_cold_prefills_capped():
    p = make_policy("queue_aware", COST, max_congestion=10.0)
    assert p.congestion(req(100), [rep(0, wait=0.5), rep(1, wait=0.9)]) == pytest.approx(5.0)
    assert p.congestion(req(100), [rep(0, wait=100.0)]) == 10.0


def test_queue_aware_churn_counts_only_the_tokens_a_replica_had_to_prefill():
    p = _quiet_queue_aware(eviction_weight=5.0)
    p.on_routed(req(100, now=0.0), Decision(0, "cache_hit", 100))  # a full hit writes nothing new
    assert p.eviction_cost_per_token(rep(0, capacity_tokens=1000), 0.0) == 0.0
    p.on_routed(req(100, now=0.0), Decision(1, "no_match", 0))
    # 100 new tokens over the 10 s window: 10 tokens/s turn a 1000-token cache over in 100 s, so an
    # evicted token was last used ~100 s ago: 5 × 10/(10 + 100) of a token's prefill
    assert p.turnover_s(rep(1, capacity_tokens=1000), 0.0) == pytest.approx(100.0)
    assert p.eviction_cost_per_token(rep(1, capacity_tokens=1000), 0.0) == pytest.approx(5 * 10 / 110 * 0.001)


def test_queue_aware_forgets_a_removed_replica():
    p = _quiet_queue_aware()
    p.on_routed(req(100, now=0.0), Decision(0, "no_match", 0))
    p.on_replica_removed(0)
    assert p.arrival_rate(0, 0.0) == 0.0
    assert p.turnover_s(rep(0, capacity_tokens=1000), 0.0) == math.inf


def _params(name: str) -> list[str]:
    import inspect

    init = POLICIES[name].__init__
    return [p for p in inspect.signature(init).parameters if p not in ("self", "cost")]


@pytest.mark.parametrize(
    ("name", "param"), [(n, p) for n in sorted(POLICIES) for p in _params(n)], ids=lambda v: str(v)
)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_parameter_that_is_not_a_finite_number_is_refused_naming_it(name, param, value):
    # --policy-param and spec.router.policyParams accept any float and rely on this check: a NaN
    # window or weight made every score NaN, and the choice arbitrary
    with pytest.raises(ValueError, match=param):
        make_policy(name, COST, **{param: value})


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("balance_abs_threshold", -1),
        ("balance_rel_threshold", -0.5),
        ("eviction_interval_s", 0),
        ("eviction_interval_s", -1),
        ("max_tree_size", -1),
    ],
)
def test_sglang_refuses_thresholds_and_intervals_that_mean_nothing(param, value):
    with pytest.raises(ValueError, match=param):
        make_policy("sglang_cache_aware", COST, **{param: value})


def test_prefill_cost_is_overhead_plus_uncached_plus_cached_lookups():
    cost = CostModel(prefill_s_per_token=0.001, cached_s_per_token=0.0001, request_overhead_s=0.5)
    assert cost.prefill_s(100, 30) == pytest.approx(0.5 + 70 * 0.001 + 30 * 0.0001)
    assert cost.prefill_s(100, 100) == pytest.approx(0.5 + 100 * 0.0001)


def test_queue_aware_gives_no_credit_for_free_cache_room():
    p = _quiet_queue_aware(eviction_weight=5.0)
    _churn(p, 0, tokens_per_s=1000)
    roomy = rep(0, wait=0.2, cached_tokens=0, capacity_tokens=1000)
    # nothing is evicted, so only wait + prefill: free room is not a bonus
    assert p.score(req(100, now=60.0), roomy) == pytest.approx(0.2 + 0.1)


def test_queue_aware_congestion_is_read_from_healthy_replicas_only():
    p = make_policy("queue_aware", COST, delay_weight=0.0, eviction_weight=0.0, congestion_weight=3.0)
    # as in the long-queues example; an idle replica that is down gives the fleet no slack
    sick = ReplicaState(2, wait_s=0.0, healthy=False)
    d = p.choose(req(100), [rep(0, matched=90, wait=0.64), rep(1, wait=0.5), sick])
    assert (d.replica_id, d.reason) == (0, "cache_hit")


def test_preble_replicates_only_beyond_its_factor():
    # the holder's TTFT 0.28 + 0.02 = 0.3 s vs 0.1 s cold: 3x, over a factor of 2 but not of 5
    fleet = [rep(0, matched=80, wait=0.28), rep(1)]
    assert make_policy("preble_e2", COST, replicate_factor=2.0).choose(req(100), fleet).reason == "replicate"
    d = make_policy("preble_e2", COST, replicate_factor=5.0).choose(req(100), fleet)
    assert (d.replica_id, d.reason) == (0, "exploit")
