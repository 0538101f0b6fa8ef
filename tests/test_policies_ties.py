"""Where routing policies send a request when several replicas tie (hypothesis and examples).

Gateway replicas read one Redis view and list the workers in the same order. Before, a tie (an idle
fleet, a prefix nobody holds, equal loads) went to the first of the tied replicas in that order, so
every gateway sent its new prefixes to the same worker. Ties are now broken by a hash of the
request's time with the replica id (``base.tie_break``): spread over requests, independent of the
order the replicas are listed in and of the prompt's content, and never in the way of a replica
that is strictly better.
"""

from __future__ import annotations

import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from prefixfleet.router.policies import CostModel, ReplicaState, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes

COST = CostModel(prefill_s_per_token=0.001)
N = 100  # request tokens
PROMPTS = 120

# round_robin rotates (no ties); sglang_cache_aware is a port that keeps sgl-router's own rule.
TIE_BREAKING = ("affinity", "affinity_balanced", "least_loaded", "preble_e2", "queue_aware")


def prompt(i: int, head: list[int] | None = None, now: float | None = None) -> RouteRequest:
    """Request ``i``: a distinct prompt of N tokens sharing ``head`` (what the replicas hold), arriving
    at its own time (a gateway's wall clock: 1.7e9 s and a few ms apart) unless ``now`` is given."""
    head = head or []
    tail = [(7919 * i + k) % 2**31 for k in range(N - len(head))]
    return RouteRequest(as_token_bytes(head + tail), N, now=1.7e9 + 0.003 * i if now is None else now)


tied_fleets = st.fixed_dictionaries(
    {
        "ids": st.lists(
            st.one_of(st.integers(0, 1000), st.text("abcdefgh0123456789-", min_size=1, max_size=12)),
            min_size=2,
            max_size=6,
            unique_by=str,
        ),
        "matched": st.sampled_from([0, 10, 50]),
        "wait": st.sampled_from([0.01, 0.05, 0.2]),
        "in_flight": st.integers(1, 20),
        "cached": st.integers(0, 900),
    }
)


def replicas(f: dict, ids: list) -> list[ReplicaState]:
    return [
        ReplicaState(
            rid,
            matched_tokens=f["matched"],
            wait_s=f["wait"],
            in_flight=f["in_flight"],
            cached_tokens=f["cached"],
            capacity_tokens=1000,
        )
        for rid in ids
    ]


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(TIE_BREAKING), f=tied_fleets)
def test_requests_spread_over_tied_replicas(name, f):
    fleet = replicas(f, f["ids"])
    head = list(range(f["matched"]))  # what every replica holds of each prompt
    picks = {make_policy(name, COST).choose(prompt(i, head), fleet).replica_id for i in range(PROMPTS)}
    if name == "affinity" and f["matched"] == 0:
        # a prefix nobody holds goes to its stable hash, tie or not (tested in test_policies.py)
        assert len(picks) > 1
    else:
        assert picks == set(f["ids"])


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(TIE_BREAKING), f=tied_fleets, seed=st.integers(0, 2**32))
def test_a_tie_goes_to_the_same_replica_whatever_the_order_or_gateway(name, f, seed):
    # affinity included for a prefix nobody holds: its rendezvous hash names a replica by id, not by
    # its place in the list
    fleet = replicas(f, f["ids"])
    shuffled = fleet[:]
    random.Random(seed).shuffle(shuffled)
    for i in range(20):
        request = prompt(i, list(range(f["matched"])))
        # two gateways (two instances) listing the workers in different orders
        a = make_policy(name, COST).choose(request, fleet).replica_id
        b = make_policy(name, COST).choose(request, shuffled).replica_id
        assert a == b


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(TIE_BREAKING), f=tied_fleets, at=st.integers(0, 6))
def test_a_strictly_better_replica_wins_over_any_tie(name, f, at):
    tied = replicas(f, f["ids"])
    # holds more of every prompt and waits less, with fewer requests in flight
    better = ReplicaState(
        "better",
        matched_tokens=f["matched"] + 10,
        wait_s=f["wait"] / 2,
        in_flight=f["in_flight"] - 1,
        cached_tokens=f["cached"],
        capacity_tokens=1000,
    )
    fleet = [*tied[:at], better, *tied[at:]]
    head = list(range(f["matched"] + 10))
    for i in range(20):
        assert make_policy(name, COST).choose(prompt(i, head), fleet).replica_id == "better"


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(TIE_BREAKING), f=tied_fleets)
def test_a_tie_does_not_depend_on_the_prompt(name, f):
    # one tenant's prompts must not steer where another's go (tests/test_tenancy_secrets.py): at
    # one time, prompts of any content and salt go to the same tied replica
    assume(not (name == "affinity" and f["matched"] == 0))
    fleet = replicas(f, f["ids"])
    head = list(range(f["matched"]))
    picks = set()
    for i in range(20):
        request = prompt(i, head, now=1.7e9)
        salted = RouteRequest(request.tokens, request.num_tokens, now=request.now, namespace=f"tenant-{i}")
        picks |= {make_policy(name, COST).choose(r, fleet).replica_id for r in (request, salted)}
    assert len(picks) == 1


def test_a_nan_load_does_not_break_the_tie_break():
    # a NaN equals nothing, itself included: the pick is still one of the offered replicas
    fleet = [ReplicaState(k, wait_s=float("nan")) for k in range(3)]
    for name in TIE_BREAKING:
        assert make_policy(name, COST).choose(prompt(1), fleet).replica_id in {0, 1, 2}
