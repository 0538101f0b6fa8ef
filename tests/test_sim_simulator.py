"""The fleet simulator: conserves requests and tokens, respects the ideal bound, shows honest views."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.policies import POLICIES, Decision, ReplicaState, RouteRequest, make_policy
from prefixfleet.router.policies.round_robin import RoundRobin
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.engine import BatchedReplica, Job, ServiceConfig
from prefixfleet.sim.report import percentile, summarize
from prefixfleet.sim.simulator import FleetConfig, simulate, simulate_ideal
from prefixfleet.sim.workloads import WorkloadRequest, build_workload

SERVICES = {
    "fifo": ServiceConfig("fifo", prefill_s_per_token=0.0001),
    "batched": ServiceConfig("batched", prefill_s_per_token=0.00004, max_running=16, step_token_budget=2048),
    "emulator": ServiceConfig(
        "emulator", prefill_s_per_token=0.00004, max_running=16, step_token_budget=2048, prefill_pass_s=0.005
    ),
}


@pytest.fixture(scope="module")
def small_prefixroute():
    return build_workload("prefixroute", num_requests=300, rate_rps=60)


@pytest.mark.parametrize("service", list(SERVICES))
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_request_is_served_once_and_tokens_are_conserved(small_prefixroute, service, policy) -> None:
    cfg = SERVICES[service]
    fleet = FleetConfig(4, 4000 if service == "fifo" else 20_000, cfg)
    run = simulate(small_prefixroute.requests, make_policy(policy, cfg.cost), fleet)
    m = summarize(run)
    assert m["requests"] == len(small_prefixroute.requests)
    assert m["prefill_tokens"] + m["cached_tokens"] == small_prefixroute.total_prompt_tokens
    assert all(c <= p for c, p in zip(run.cached_tokens, run.prompt_tokens, strict=True))
    assert all(t > 0 for t in run.ttft_s)
    assert sum(m["replica_share"]) == pytest.approx(1.0, abs=1e-3)
    assert m["max_replica_share"] == max(m["replica_share"])
    assert sum(run.decisions.values()) == len(small_prefixroute.requests)


@pytest.mark.parametrize("service", list(SERVICES))
def test_ideal_bound_is_never_beaten(small_prefixroute, service) -> None:
    cfg = SERVICES[service]
    fleet = FleetConfig(4, 4000 if service == "fifo" else 20_000, cfg)
    ideal = summarize(simulate_ideal(small_prefixroute.requests, fleet))
    for name in POLICIES:
        m = summarize(simulate(small_prefixroute.requests, make_policy(name, cfg.cost), fleet))
        assert ideal["mean_ttft_ms"] <= m["mean_ttft_ms"], name
        assert ideal["hit_rate"] >= m["hit_rate"], name
        assert ideal["prefill_tokens"] <= m["prefill_tokens"], name


def test_simulation_is_deterministic(small_prefixroute) -> None:
    cfg = SERVICES["fifo"]
    fleet = FleetConfig(4, 4000, cfg)
    a = simulate(small_prefixroute.requests, make_policy("queue_aware", cfg.cost), fleet)
    b = simulate(small_prefixroute.requests, make_policy("queue_aware", cfg.cost), fleet)
    assert a.ttft_s == b.ttft_s and a.replica == b.replica


class RecordingRoundRobin(RoundRobin):
    """Round robin that keeps the view of the replica it picked (a test policy, not a mock)."""

    name = "recording_round_robin"

    def __init__(self, cost=None) -> None:
        super().__init__(cost)
        self.seen: list[ReplicaState] = []

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        assert all(type(r) is ReplicaState for r in replicas)
        decision = super().choose(request, replicas)
        self.seen.append(next(r for r in replicas if r.replica_id == decision.replica_id))
        return decision


def test_several_gateways_each_route_every_nth_request_with_their_own_state(small_prefixroute) -> None:
    cfg = SERVICES["batched"]
    fleet = FleetConfig(4, 20_000, cfg)
    gateways = [RecordingRoundRobin(cfg.cost), RecordingRoundRobin(cfg.cost)]
    run = simulate(small_prefixroute.requests, gateways, fleet)
    n = len(small_prefixroute.requests)
    assert [len(g.seen) for g in gateways] == [(n + 1) // 2, n // 2]
    # Each gateway's round robin counts only its own requests: both start at the same replica.
    assert run.replica[0] == run.replica[1]
    # An SGLang router tree per gateway sees half the traffic, so locality suffers (as live).
    one = summarize(simulate(small_prefixroute.requests, make_policy("sglang_cache_aware", cfg.cost), fleet))
    two = summarize(
        simulate(
            small_prefixroute.requests, [make_policy("sglang_cache_aware", cfg.cost) for _ in range(2)], fleet
        )
    )
    assert two["hit_rate"] < one["hit_rate"]
    with pytest.raises(ValueError, match="at least one policy"):
        simulate(small_prefixroute.requests, [], fleet)


def test_fifo_views_show_the_exact_hit_and_wait_the_request_then_gets() -> None:
    wl = build_workload("lab-burst")
    cfg = ServiceConfig("fifo", prefill_s_per_token=0.000025, cached_s_per_token=0.0000015)
    policy = RecordingRoundRobin(cfg.cost)
    run = simulate(wl.requests, policy, FleetConfig(4, 9216, cfg))
    for view, ttft, matched, req in zip(policy.seen, run.ttft_s, run.cached_tokens, wl.requests, strict=True):
        assert view.matched_tokens == matched
        assert ttft == pytest.approx(view.wait_s + cfg.compute_s(req.num_tokens, matched))
    assert any(v.wait_s > 0 and v.in_flight > 0 and v.pending_prefill_tokens > 0 for v in policy.seen)


def test_fifo_round_robin_on_the_lab_burst_matches_the_labs_round_robin() -> None:
    # The lab's queue (drains 14 ms per arrival) is a FIFO with one arrival every 14 ms.
    wl = build_workload("lab-burst")
    cfg = ServiceConfig("fifo", prefill_s_per_token=0.000025, cached_s_per_token=0.0000015)
    m = summarize(simulate(wl.requests, make_policy("round_robin", cfg.cost), FleetConfig(4, 9216, cfg)))
    assert m["hit_rate"] == 0.7353
    assert m["mean_ttft_ms"] == pytest.approx(47.19, abs=0.01)
    assert m["max_ttft_ms"] == pytest.approx(108.8, abs=0.01)


def test_batched_replica_pins_running_prefixes_and_releases_them_when_done() -> None:
    cfg = ServiceConfig(
        "batched",
        prefill_s_per_token=0.001,
        max_running=2,
        step_token_budget=100,
        decode_base_s=0.01,
        decode_s_per_seq=0.0,
    )
    rep = BatchedReplica(0, 1000, cfg)
    shared, other = as_token_bytes(range(300)), as_token_bytes(range(5000, 5300))
    jobs = [Job(0, 0.0, shared, 3), Job(1, 0.0, shared, 3), Job(2, 0.0, other, 3)]
    for job in jobs:
        rep.accept(job, 0.0)
    assert rep.tree.pinned_tokens == 300  # two running requests share one pinned prompt
    now, finished = 0.0, []
    for _ in range(100):
        t = rep.next_event_s()
        if t is None:
            break
        now = t
        finished += rep.on_event(now)
    assert sorted(j.index for j in finished) == [0, 1, 2]
    assert rep.tree.pinned_tokens == 0
    assert jobs[1].matched == 300 and jobs[0].matched == 0
    # Job 0 starts a 0.11 s step at once (100-token chunk); job 1 joins at the next step and, a full
    # hit, gets its first token from that step alone. Its decode tokens then share the 100-token
    # budget, so job 0's prefill is chunked 100 + 100 + 99 + 1 over 4 steps. Job 2 waits for a slot.
    assert jobs[1].ttft_s < jobs[0].ttft_s < jobs[2].ttft_s
    assert jobs[1].ttft_s == pytest.approx(2 * (0.01 + 100 * 0.001))
    assert jobs[0].ttft_s == pytest.approx(4 * 0.01 + 300 * 0.001)


def test_batched_replica_waits_for_cache_room_held_by_running_requests() -> None:
    cfg = ServiceConfig("batched", prefill_s_per_token=0.0, max_running=8, decode_base_s=0.01)
    rep = BatchedReplica(0, 500, cfg)
    a = Job(0, 0.0, as_token_bytes(range(400)), 5)
    b = Job(1, 0.0, as_token_bytes(range(1000, 1400)), 5)
    rep.accept(a, 0.0)
    rep.accept(b, 0.0)
    view = rep.view(RouteRequest(tokens=b"", num_tokens=0, now=0.0))
    assert view.in_flight == 2 and view.queued == 1 and view.wait_s > 0
    while (t := rep.next_event_s()) is not None:
        rep.on_event(t)
    assert b.start_s >= a.finish_s  # b could only start once a released its 400 pinned tokens
    assert rep.tree.pinned_tokens == 0


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(101)), 99) == 99.0


prefix_pool = [as_token_bytes(range(base, base + n)) for base, n in ((0, 40), (1000, 25), (2000, 60))]


@st.composite
def small_workloads(draw) -> list[WorkloadRequest]:
    n = draw(st.integers(1, 40))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.floats(0.0, 0.02))
        prefix = prefix_pool[draw(st.integers(0, len(prefix_pool) - 1))]
        cut = draw(st.integers(0, len(prefix) // 4))
        suffix = as_token_bytes(range(10_000 + 100 * i, 10_000 + 100 * i + draw(st.integers(1, 30))))
        out.append(WorkloadRequest(t, prefix[: cut * 4] + suffix, draw(st.integers(1, 5)), "g"))
    return out


@settings(max_examples=40, deadline=None)
@given(
    requests=small_workloads(),
    service=st.sampled_from(list(SERVICES)),
    policy=st.sampled_from(list(POLICIES)),
    replicas=st.integers(1, 3),
    cache=st.integers(60, 200),
)
def test_no_request_beats_its_own_ideal_bound(requests, service, policy, replicas, cache) -> None:
    cfg = SERVICES[service]
    if service == "emulator":  # an emulated engine refuses what its KV pool cannot hold
        cache = max(cache, max(r.num_tokens + r.output_tokens for r in requests))
    fleet = FleetConfig(replicas, cache, cfg)
    run = simulate(requests, make_policy(policy, cfg.cost), fleet)
    ideal = simulate_ideal(requests, fleet)
    assert sum(run.prompt_tokens) == sum(r.num_tokens for r in requests)
    for got, bound, hit, best in zip(
        run.ttft_s, ideal.ttft_s, run.cached_tokens, ideal.cached_tokens, strict=True
    ):
        assert hit <= best
        assert got >= bound - 1e-12


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30),
    q=st.floats(0, 100),
)
def test_percentile_agrees_with_numpy(values, q) -> None:
    import numpy

    assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)), rel=1e-9, abs=1e-6)
