"""The simulator's ``emulator`` service model: the local fleet's engines, as a live gateway sees them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from prefixfleet.emulator.engine import EngineModel, EngineRequest
from prefixfleet.emulator.text import generated_tokens, generated_words, generation_seed
from prefixfleet.router.policies import Decision, ReplicaState, RouteRequest, make_policy
from prefixfleet.router.policies.round_robin import RoundRobin
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.engine import EmulatedReplica, ServiceConfig
from prefixfleet.sim.simulator import FleetConfig, simulate
from prefixfleet.sim.workloads import WorkloadRequest, build_workload

# The local fleet's engines at prefixroute's settings: a 4000-token pool holds ~4 running requests.
EMULATED = ServiceConfig(
    "emulator",
    prefill_s_per_token=0.0001,
    cached_s_per_token=1.5e-6,
    prefill_pass_s=0.010,
    decode_base_s=0.020,
    decode_s_per_seq=0.00015,
    max_running=64,
    step_token_budget=8192,
)


@pytest.fixture(scope="module")
def busy_requests() -> list[WorkloadRequest]:
    wl = build_workload("prefixroute", num_requests=150, rate_rps=30.0)
    return [replace(r, output_tokens=4) for r in wl.requests]


def emulator_ttfts(requests: Sequence[WorkloadRequest], service: ServiceConfig, cache: int) -> list[float]:
    """The emulator's own scheduler serving ``requests`` on a virtual clock, as its runner loop does:
    arrivals wait for the iteration in progress; an idle engine plans as soon as one arrives."""
    engine = EngineModel(service.emulator_config(cache))
    ttft: dict[int, float] = {}
    now, nxt = 0.0, 0
    while True:
        while nxt < len(requests) and requests[nxt].arrival_s <= now:
            r = requests[nxt]
            output = as_token_bytes(
                generated_tokens(generated_words(generation_seed(r.tokens), r.output_tokens))
            )
            engine.submit(EngineRequest(str(nxt), r.tokens, r.output_tokens, output, r.arrival_s))
            nxt += 1
        iteration = engine.plan(now)
        if iteration is None:
            if nxt == len(requests):
                return [ttft[i] for i in range(len(requests))]
            now = requests[nxt].arrival_s
            continue
        now += iteration.duration
        for p in engine.commit(iteration, now):
            if p.first:
                ttft[int(p.request.rid)] = now - p.request.arrival


def test_one_simulated_replica_gives_every_request_the_emulators_own_ttft(busy_requests) -> None:
    run = simulate(busy_requests, make_policy("round_robin"), FleetConfig(1, 4000, EMULATED))
    assert run.ttft_s == pytest.approx(emulator_ttfts(busy_requests, EMULATED, 4000), abs=1e-9)
    assert max(run.ttft_s) > 10 * min(run.ttft_s)  # the pool, not the workload, sets the waits


def test_the_same_engine_on_a_slower_clock_scales_every_ttft(busy_requests) -> None:
    fleet = FleetConfig(2, 4000, EMULATED)
    base = simulate(busy_requests, [make_policy("round_robin") for _ in range(2)], fleet)
    slow = [replace(r, arrival_s=r.arrival_s * 2.0) for r in busy_requests]
    scaled = simulate(
        slow,
        [make_policy("round_robin") for _ in range(2)],
        replace(fleet, service=EMULATED.scaled_time(2.0)),
    )
    assert scaled.ttft_s == pytest.approx([2.0 * t for t in base.ttft_s], rel=1e-9)
    assert scaled.cached_tokens == base.cached_tokens


class RecordingRoundRobin(RoundRobin):
    """Round robin that keeps every view it was shown (a test policy, not a mock)."""

    name = "recording_round_robin"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[ReplicaState]] = []

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        self.seen.append(list(replicas))
        return super().choose(request, replicas)


def test_views_are_the_sidecars_load_record_not_the_engines_internals() -> None:
    # Three 1000-token misses at once on one replica: nothing has answered when the third is routed.
    reqs = [WorkloadRequest(0.0, as_token_bytes(range(1000 * i, 1000 * i + 1000)), 4, "g") for i in range(3)]
    policy = RecordingRoundRobin()
    simulate(reqs, policy, FleetConfig(1, 4000, EMULATED))
    third = policy.seen[2][0]
    assert third.in_flight == 2 and third.queued == 2
    # the sidecar counts each forwarded request's predicted uncached tokens until its first byte,
    # including the one the engine is prefilling right now
    assert third.pending_prefill_tokens == 2000
    # + the fixed latency, which a sidecar in front of the emulator starts from its stated step costs
    stated = EMULATED.prefill_pass_s + EMULATED.decode_base_s
    assert third.wait_s == pytest.approx(2000 * EMULATED.prefill_s_per_token + stated)


def test_configurations_the_emulator_cannot_run_are_refused() -> None:
    with pytest.raises(ValueError, match="prefill_pass_s"):
        ServiceConfig("emulator", prefill_s_per_token=0.0001, request_overhead_s=0.01)
    with pytest.raises(ValueError, match="emulator service model only"):
        ServiceConfig("batched", prefill_pass_s=0.01)
    with pytest.raises(ValueError, match="prefill_s_per_token > 0"):
        ServiceConfig("emulator", prefill_s_per_token=0.0)
    too_long = [WorkloadRequest(0.0, as_token_bytes(range(200)), 4, "g")]
    with pytest.raises(ValueError, match="KV pool"):
        simulate(too_long, make_policy("round_robin"), FleetConfig(1, 150, EMULATED))


def test_a_gateway_sees_another_gateways_sends_only_once_the_sidecar_pushed_its_load() -> None:
    # Pushes at most every 20 ms, seen 5 ms later: a miss routed by gateway 0 at t=0 is invisible
    # to gateway 1 at t=1 ms, visible at t=10 ms (pushed at once, the first push after a quiet spell).
    lagged = replace(EMULATED, report_gap_s=0.020, report_delay_s=0.005)
    reqs = [
        WorkloadRequest(t, as_token_bytes(range(1000 * i, 1000 * i + 800)), 4, "g")
        for i, t in enumerate((0.0, 0.001, 0.002, 0.010))
    ]
    gateways = [RecordingRoundRobin(), RecordingRoundRobin()]
    simulate(reqs, gateways, FleetConfig(1, 4000, lagged))
    first_look_1, first_look_0, second_look_1 = (
        gateways[1].seen[0][0],
        gateways[0].seen[1][0],
        gateways[1].seen[1][0],
    )
    assert first_look_1.in_flight == 0 and first_look_1.pending_prefill_tokens == 0
    # its own send counts at once, whatever the report says
    assert first_look_0.in_flight == 1 and first_look_0.pending_prefill_tokens == 800
    # t=10 ms: the push at t=0 arrived (it counts #0); #1 and #2 wait for the next push (t=20 ms),
    # but #1 was gateway 1's own send
    assert second_look_1.in_flight == 2 and second_look_1.pending_prefill_tokens == 1600


def test_matched_tokens_are_the_sidecar_mirrors_in_whole_hash_blocks_from_the_moment_of_routing() -> None:
    prefix = as_token_bytes(range(500))
    reqs = [
        WorkloadRequest(0.0, prefix + as_token_bytes(range(10_000, 10_100)), 4, "g"),
        WorkloadRequest(0.0001, prefix + as_token_bytes(range(20_000, 20_100)), 4, "g"),
    ]
    policy = RecordingRoundRobin()
    run = simulate(reqs, policy, FleetConfig(1, 4000, EMULATED))
    # The first is not admitted yet (the engine's tree is empty) but its prompt was forwarded.
    assert policy.seen[1][0].matched_tokens == 496  # 500 shared tokens = 31 whole 16-token blocks
    assert run.cached_tokens[1] == 500  # the engine itself matches token by token


def test_the_up_sim_check_routes_the_token_ids_the_live_fleet_sees(busy_requests) -> None:
    from prefixfleet.fleet.load import requests_from_workload
    from prefixfleet.fleet.local import live_tokens
    from prefixfleet.sim.workloads import Workload
    from prefixfleet.tokenizer import tokenize

    sent = requests_from_workload(Workload("w", busy_requests[:5], {}, {}))
    seen = live_tokens([r.tokens for r in busy_requests[:5]])
    assert seen == [as_token_bytes(tokenize(wire.prompt)) for wire in sent]
    assert live_tokens([]) == []


def test_gateways_match_against_the_last_summary_they_adopted_plus_their_own_recent_sends() -> None:
    # Summaries every 250 ms, adopted 100 ms later; own sends count until a summary generated 1 s
    # after them. Gateway 0 sends a 640-token prompt at t=0; gateway 1 asks about it at t=0.1 s
    # (nothing adopted yet) and t=0.5 s (the t=0.25 s summary has it); gateway 0 sees it at once.
    lagged = replace(EMULATED, summary_interval_s=0.25, summary_delay_s=0.1, overlay_slack_s=1.0)
    prompt = as_token_bytes(range(640))
    reqs = [
        WorkloadRequest(t, prompt + as_token_bytes(range(10_000 * i, 10_000 * i + 50)), 4, "g")
        for i, t in enumerate((0.0, 0.1, 0.2, 0.5))
    ]
    gateways = [RecordingRoundRobin(), RecordingRoundRobin()]
    simulate(reqs, gateways, FleetConfig(1, 4000, lagged))
    assert [views[0].matched_tokens for views in gateways[1].seen] == [0, 640]
    assert [views[0].matched_tokens for views in gateways[0].seen] == [0, 640]


def test_a_sidecar_carries_its_measurements_into_the_next_policys_run(busy_requests) -> None:
    fleet = FleetConfig(1, 4000, EMULATED)
    first = EmulatedReplica(0, 4000, EMULATED)
    simulate(busy_requests, make_policy("round_robin"), fleet, replicas=[first])
    measured = first.load.prefill_tokens_per_s
    assert first.load.samples > 0 and measured != pytest.approx(1.0 / EMULATED.prefill_s_per_token)
    second = EmulatedReplica(0, 4000, EMULATED)
    second.carry_sidecar_from(first)
    policy = RecordingRoundRobin()
    two = [WorkloadRequest(0.0, as_token_bytes(range(1000 * i, 1000 * i + 1000)), 4, "g") for i in range(2)]
    simulate(two, policy, fleet, replicas=[second])
    assert policy.seen[1][0].wait_s == pytest.approx(1000 / measured + first.load.fixed_latency_s)
    with pytest.raises(ValueError, match="unused replicas"):
        simulate(two, make_policy("round_robin"), fleet, replicas=[second])


def test_a_send_still_on_its_way_drops_out_of_its_gateways_count_when_a_newer_record_omits_it() -> None:
    # Requests reach the sidecar 10 ms after the gateway sent them; every change is pushed at once.
    # Gateway 1 sends #1 at 5 ms; the record pushed when #0 arrives (10 ms) is newer than that send
    # but does not count it yet, so at 12 ms gateway 1 sees one request where two are on their way.
    transit = replace(EMULATED, forward_delay_s=0.010)
    reqs = [
        WorkloadRequest(t, as_token_bytes(range(1000 * i, 1000 * i + 800)), 4, "g")
        for i, t in enumerate((0.0, 0.005, 0.011, 0.012, 0.030))
    ]
    gateways = [RecordingRoundRobin(), RecordingRoundRobin()]
    run = simulate(reqs, gateways, FleetConfig(1, 4000, transit))
    assert gateways[1].seen[1][0].in_flight == 1
    assert gateways[0].seen[2][0].in_flight == 4  # at 30 ms every earlier send has been counted
    assert run.ttft_s[0] > 0.010  # the trip is part of the time to first token


def test_up_sim_check_averages_seeded_draws_of_forwarding_delays_per_request(busy_requests) -> None:
    from prefixfleet.fleet.local import EngineSettings, FleetSpec, simulate_policies

    spec = FleetSpec(2, 2, EngineSettings(cache_tokens=4000, prefill_tokens_per_s=10_000.0, time_scale=0.5))
    reqs = busy_requests[:60]
    a = simulate_policies(reqs, ["round_robin", "least_loaded"], spec, realizations=3)
    b = simulate_policies(reqs, ["round_robin", "least_loaded"], spec, realizations=3)
    assert a == b  # seeded: the same figures every time
    for m in a.values():
        assert m["realizations"] == 3 and len(m["ttft_ms_by_request"]) == len(reqs)
        assert m["mean_ttft_ms"] == pytest.approx(sum(m["ttft_ms_by_request"]) / len(reqs), abs=1e-3)
    once = simulate_policies(reqs, ["round_robin"], spec, realizations=0)
    assert once["round_robin"]["realizations"] == 1


def test_up_sim_check_leaves_out_what_the_engines_would_refuse(busy_requests) -> None:
    from prefixfleet.fleet.local import EngineSettings, FleetSpec, simulate_policies

    spec = FleetSpec(2, 2, EngineSettings(cache_tokens=1000, prefill_tokens_per_s=10_000.0, time_scale=0.5))
    reqs = busy_requests[:40]
    fits = [r.num_tokens + r.output_tokens <= 1000 for r in reqs]
    assert any(fits) and not all(fits)
    got = simulate_policies(reqs, ["round_robin"], spec, realizations=1)["round_robin"]["ttft_ms_by_request"]
    assert [not math.isnan(t) for t in got] == fits


def test_gateways_that_share_sends_see_each_others_prefixes_before_any_summary() -> None:
    # Gateway 0 sends prefix A at t=0; gateway 1 (which never sent A) asks about A at 20 ms. No
    # summary comes before 250 ms, so only a shared send notice (seen 10 ms after it) can tell it.
    summaries = replace(EMULATED, summary_interval_s=0.25, summary_delay_s=0.1, overlay_slack_s=1.0)
    a = as_token_bytes(range(640))
    prompts = (a, as_token_bytes(range(50_000, 50_640)), as_token_bytes(range(60_000, 60_640)), a)
    reqs = [
        WorkloadRequest(t, prompt + as_token_bytes(range(10_000 * i, 10_000 * i + 50)), 4, "g")
        for i, (t, prompt) in enumerate(zip((0.0, 0.005, 0.010, 0.020), prompts, strict=True))
    ]
    seen = {}
    for share in (False, True):
        gateways = [RecordingRoundRobin(), RecordingRoundRobin()]
        config = replace(summaries, share_sends=share, share_delay_s=0.010 if share else 0.0)
        simulate(reqs, gateways, FleetConfig(1, 4000, config))
        seen[share] = gateways[1].seen[1][0].matched_tokens
    assert seen == {False: 0, True: 640}
    with pytest.raises(ValueError, match="emulator service model only"):
        ServiceConfig("batched", share_sends=True)
