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
from prefixfleet.sim.engine import FifoReplica, Job, ReplicaModel, ServiceConfig


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
