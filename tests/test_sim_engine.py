"""The simulator's replica models on a virtual clock, against hand-derived numbers.

``ServiceConfig.unloaded_ttft_s`` is the floor the ``ideal`` bound uses; it must be what an idle
replica of the model actually gives, so it is checked against the model itself.
"""

from __future__ import annotations

import math

import pytest
from sim_replicas import batched_replica

from prefixfleet.router.policies import RouteRequest
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.engine import BatchedReplica, FifoReplica, Job, ReplicaModel, ServiceConfig


def job(index: int, tokens: list[int], arrival: float = 0.0, output: int = 1) -> Job:
    return Job(index, arrival, as_token_bytes(tokens), output)


def run_until_first_token(replica: ReplicaModel, j: Job) -> None:
    for _ in range(10_000):  # bounded: a handful of steps is expected
        if not math.isnan(j.ttft_s):
            return
        t = replica.next_event_s()
        assert t is not None, "the replica stopped with the job unserved"
        replica.on_event(t)
    raise AssertionError("no first token after 10,000 steps")


@pytest.mark.parametrize("uncached", [1, 199, 200, 201, 450, 1000])
def test_an_idle_batched_replica_gives_exactly_the_unloaded_ttft(uncached):
    # 200 tokens a step: ceil(uncached / 200) steps of 10 ms plus 1 ms a prefill token
    replica = batched_replica(False, capacity=10_000, budget=200)
    j = job(0, list(range(uncached)))
    replica.accept(j, 0.0)
    run_until_first_token(replica, j)
    expected = math.ceil(uncached / 200) * 0.01 + uncached * 0.001
    assert j.ttft_s == pytest.approx(expected)
    assert replica.config.unloaded_ttft_s(uncached, 0) == pytest.approx(expected)


def test_a_cached_prefix_is_not_prefilled_again_on_an_idle_batched_replica():
    replica = batched_replica(False, capacity=10_000, budget=200)
    first = job(0, list(range(300)))
    replica.accept(first, 0.0)
    run_until_first_token(replica, first)
    for _ in range(100):  # let it finish
        t = replica.next_event_s()
        if t is None:
            break
        replica.on_event(t)
    second = job(1, [*range(300), *range(5000, 5250)], arrival=10.0)
    replica.accept(second, 10.0)
    run_until_first_token(replica, second)
    # 250 uncached tokens: 2 steps
    assert second.matched == 300
    assert second.ttft_s == pytest.approx(2 * 0.01 + 250 * 0.001)
    assert replica.config.unloaded_ttft_s(550, 300) == pytest.approx(second.ttft_s)


def test_a_fifo_replica_reports_its_queue_as_a_policy_sees_it():
    # 2**-10 s a token and 128-token prompts: every time below is exact in binary floating point
    cfg = ServiceConfig("fifo", prefill_s_per_token=2**-10)
    replica = FifoReplica(0, 10_000, cfg)
    for i in range(3):  # three cold prompts at t=0: prefills 0-0.125, 0.125-0.25, 0.25-0.375 s
        replica.accept(job(i, list(range(1000 * i, 1000 * i + 128))), 0.0)
    probe = [*range(1000, 1060), 99_999]  # shares 60 tokens with the second prompt
    state = replica.view(RouteRequest(as_token_bytes(probe), len(probe), now=0.0625))
    assert (state.in_flight, state.queued, state.matched_tokens) == (3, 2, 60)
    assert state.wait_s == 0.375 - 0.0625
    assert state.pending_prefill_tokens == 3 * 128 - 64  # the head is half-way through its prefill
    assert cfg.unloaded_ttft_s(128, 0) == 0.125
    later = replica.view(RouteRequest(as_token_bytes(probe), len(probe), now=0.3125))
    assert (later.in_flight, later.queued, later.pending_prefill_tokens) == (1, 0, 64)


def batched(*, capacity: int = 10_000, max_running: int = 8, per_seq: float = 0.0) -> BatchedReplica:
    """1 ms a prefill token, 200 tokens a step, 10 ms a step (+ ``per_seq`` per decoding sequence)."""
    cfg = ServiceConfig(
        "batched",
        prefill_s_per_token=0.001,
        max_running=max_running,
        step_token_budget=200,
        decode_base_s=0.01,
        decode_s_per_seq=per_seq,
    )
    return BatchedReplica(0, capacity, cfg)


def run_until(replica: ReplicaModel, done) -> None:
    for _ in range(10_000):
        if done():
            return
        t = replica.next_event_s()
        assert t is not None, "the replica went idle first"
        replica.on_event(t)
    raise AssertionError("not done after 10,000 steps")


def test_a_decode_step_costs_the_base_plus_a_share_per_decoding_sequence():
    replica = batched(per_seq=0.001)
    a = job(0, list(range(100)), output=3)  # the prefill step emits token 1, two decode steps follow
    replica.accept(a, 0.0)
    run_until(replica, lambda: not math.isnan(a.finish_s))
    assert a.ttft_s == pytest.approx(0.01 + 100 * 0.001)
    assert a.finish_s == pytest.approx(a.ttft_s + 2 * (0.01 + 0.001))


def test_a_full_replica_reports_the_wait_for_a_slot_to_free():
    replica = batched(max_running=1)
    a = job(0, list(range(10)), output=50)
    replica.accept(a, 0.0)
    run_until(replica, lambda: not math.isnan(a.ttft_s))  # t = 0.02: a decodes 49 more steps
    now = replica.next_event_s() - 0.01  # the start of the step in progress
    probe = list(range(500, 510))
    wait = replica.view(RouteRequest(as_token_bytes(probe), 10, now=now)).wait_s
    b = job(1, probe, arrival=now)
    replica.accept(b, now)
    run_until(replica, lambda: not math.isnan(b.start_s))
    # b is admitted only when a finishes; the estimate (which also charges b's own step) is that
    # wait to within the one step in progress
    actual = b.start_s - now
    assert actual == pytest.approx(49 * 0.01)
    assert actual <= wait - 0.01 <= actual + 0.01 + 1e-9


def test_behind_a_request_blocked_for_cache_room_a_new_one_waits_for_a_running_one_to_finish():
    # 100 cached tokens: a running 80-token prompt holds its pinned prefix, so a cold 50-token one
    # cannot be admitted though slots are free; a third request cannot start before the first ends
    replica = batched(capacity=100, max_running=8)
    a = job(0, list(range(80)), output=30)
    replica.accept(a, 0.0)
    run_until(replica, lambda: not math.isnan(a.ttft_s))
    b = job(1, list(range(1000, 1050)), arrival=a.ttft_s, output=20)
    replica.accept(b, a.ttft_s)
    now = replica.next_event_s()
    replica.on_event(now)  # the next step tries to admit b
    assert math.isnan(b.start_s)  # blocked for room
    probe = list(range(2000, 2010))
    state = replica.view(RouteRequest(as_token_bytes(probe), 10, now=now))
    assert (state.in_flight, state.queued) == (2, 1)
    c = job(2, probe, arrival=now)
    replica.accept(c, now)
    run_until(replica, lambda: not math.isnan(c.start_s))
    assert c.start_s == pytest.approx(a.finish_s)  # a's 28 decode steps left
    # a lower bound only: the estimate assumes c also waits for b, which it need not when it fits
    # beside b (it does here: 50 + 10 <= 100), so it overestimates this wait (0.5 s vs 0.28 s)
    assert state.wait_s >= c.start_s - now
