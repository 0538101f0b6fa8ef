"""Properties every routing decision keeps, over random fleets (hypothesis).

Each reason a policy gives is a claim about the fleet it saw; these check the claim against the
views, whatever the numbers: a decision names a healthy replica, reports what that replica holds, and
its reason is true of it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.policies import POLICIES, CostModel, ReplicaState, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes

COST = CostModel(prefill_s_per_token=0.001)
N = 100  # request tokens

replicas = st.lists(
    st.builds(
        lambda matched, wait, in_flight, cached, healthy: (matched, wait, in_flight, cached, healthy),
        st.sampled_from([0, 0, 10, 50, 90, N]),
        st.sampled_from([0.0, 0.01, 0.05, 0.2, 1.0]),
        st.integers(0, 200),
        st.integers(0, 1000),
        st.booleans(),
    ),
    min_size=1,
    max_size=5,
).filter(lambda rs: any(r[4] for r in rs))


def fleet(specs) -> list[ReplicaState]:
    return [
        ReplicaState(
            i,
            matched_tokens=m,
            wait_s=w,
            in_flight=f,
            cached_tokens=c,
            capacity_tokens=1000,
            healthy=h,
        )
        for i, (m, w, f, c, h) in enumerate(specs)
    ]


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(POLICIES)), rounds=st.lists(replicas, min_size=1, max_size=4))
def test_every_decision_names_a_healthy_replica_and_its_reason_is_true(name, rounds):
    policy = make_policy(name, COST)
    for i, specs in enumerate(rounds):
        views = fleet(specs)
        request = RouteRequest(as_token_bytes(range(N)), N, now=float(i))
        d = policy.choose(request, views)
        live = [r for r in views if r.healthy]
        chosen = next(r for r in live if r.replica_id == d.replica_id)
        best = max(r.matched_tokens for r in live)
        assert d.reason in policy.reasons
        assert d.expected_matched_tokens == chosen.matched_tokens
        if d.reason == "no_match":
            assert best == 0
        # (sglang's cache_hit is judged on its own approximate tree, not on the views)
        if d.reason == "cache_hit" and name != "sglang_cache_aware":
            assert chosen.matched_tokens == best > 0
        if d.reason == "load_balance":
            assert chosen.matched_tokens < best
        if d.reason == "load_guard":
            assert chosen.wait_s == min(r.wait_s for r in live)
        if d.reason == "exploit":
            assert chosen.matched_tokens == best and N - best < best
        if d.reason in ("least_loaded", "imbalanced", "low_match"):
            key = (lambda r: (r.wait_s, r.in_flight)) if name == "least_loaded" else (lambda r: r.in_flight)
            assert key(chosen) == min(key(r) for r in live)
        policy.on_routed(request, d)
