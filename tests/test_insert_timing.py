"""When a prompt counts as cached for other requests: at admission (the optimistic default) or only
once the prefill pass computing it has completed (``cache_on_compute``, SGLang-like).

Both the emulator's scheduler (``EngineModel``) and the simulator's ``batched`` replica, on virtual
clocks: no I/O, no wall time.
"""

from __future__ import annotations

import argparse
import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_replicas import batched_replica

from prefixfleet.cli import UsageError
from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.engine import (
    EngineModel,
    EngineRequest,
    RequestState,
    make_request,
    run_until_idle,
)
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.cli import service_config
from prefixfleet.sim.engine import BatchedReplica, Job, ServiceConfig

LONG = list(range(1, 5001))  # a 5000-token prompt nobody has seen: 3 passes of 2048 tokens


def engine(cache_on_compute: bool, **overrides: object) -> EngineModel:
    base: dict[str, object] = dict(cache_tokens=20_000, chunk_tokens=2_048, max_running=8)
    base.update(overrides)
    return EngineModel(EmulatorConfig(cache_on_compute=cache_on_compute, **base))  # type: ignore[arg-type]


def submit(model: EngineModel, rid: str, prompt: list[int], max_new: int, now: float = 0.0) -> EngineRequest:
    request = make_request(rid, prompt, max_new, range(7_000_000, 7_000_000 + max_new), now)
    model.submit(request)
    return request


def step(model: EngineModel, now: float) -> float:
    iteration = model.plan(now)
    assert iteration is not None
    now += iteration.duration
    model.commit(iteration, now)
    return now


def cached_in_tree(model: EngineModel, prompt: list[int]) -> int:
    return model.tree.match_prefix(as_token_bytes(prompt), touch=False).matched_tokens


@pytest.mark.parametrize(("cache_on_compute", "expected"), [(False, 5000), (True, 2 * 2048)])
def test_a_request_admitted_mid_chunk_finds_only_completed_chunks_cached(cache_on_compute, expected):
    model = engine(cache_on_compute)
    first = submit(model, "first", LONG, 4)
    now = step(model, 0.0)  # pass 1: first's tokens 0..2047
    # At admission (default) the whole prompt is in the tree; otherwise only the computed chunk.
    assert cached_in_tree(model, LONG) == (5000 if not cache_on_compute else 2048)
    second = submit(model, "second", [*LONG, 9001, 9002], 4, now)
    now = step(model, now)  # pass 2: first's second chunk fills the budget, second waits
    assert second.state is RequestState.WAITING
    now = step(model, now)  # pass 3: first's last 904 tokens, then second is admitted

    assert first.cached_tokens == 0
    assert second.cached_tokens == expected
    run_until_idle(model, now)
    assert model.tree.pinned_tokens == 0 and not model.tree.pinned_sequences()


def test_same_pass_duplicate_waits_one_pass_and_then_hits_while_others_go_ahead():
    model = engine(True, chunk_tokens=4_096)
    prompt = list(range(1, 1001))
    a = submit(model, "a", prompt, 2)
    b = submit(model, "b", [*prompt, 5], 2)  # shares a's 1000 uncomputed tokens
    c = submit(model, "c", list(range(50_000, 50_300)), 2)  # unrelated, behind b
    iteration = model.plan(0.0)
    assert [p.request.rid for p in iteration.prefill] == ["a", "c"]
    now = iteration.duration
    model.commit(iteration, now)
    assert model.waiting[0] is b  # still first in line for the next pass
    run_until_idle(model, now)

    assert b.cached_tokens == 1000 and b.prefill_started_at == now
    assert a.cached_tokens == c.cached_tokens == 0


def test_default_mode_shares_a_prefix_within_one_pass():
    model = engine(False, chunk_tokens=4_096)
    prompt = list(range(1, 1001))
    submit(model, "a", prompt, 2)
    b = submit(model, "b", [*prompt, 5], 2)
    iteration = model.plan(0.0)
    assert [p.request.rid for p in iteration.prefill] == ["a", "b"]
    assert b.cached_tokens == 1000


def test_abort_mid_chunk_leaves_only_the_computed_chunks_cached():
    model = engine(True)
    submit(model, "a", LONG, 4)
    now = step(model, 0.0)
    assert model.abort("a")
    assert cached_in_tree(model, LONG) == 2048
    assert model.tree.pinned_tokens == 0 and model.reserved_prefill_tokens == 0
    assert model.plan(now) is None


# -- the simulator's batched replica ------------------------------------------------------------


batched = functools.partial(batched_replica, capacity=2_000)


def drain(rep: BatchedReplica, now: float, until: float = math.inf) -> tuple[float, list[Job]]:
    finished: list[Job] = []
    for _ in range(10_000):
        t = rep.next_event_s()
        if t is None or t > until:
            return now, finished
        now = t
        finished += rep.on_event(now)
    raise AssertionError("replica still busy")


@pytest.mark.parametrize(("cache_on_compute", "expected"), [(False, 500), (True, 400)])
def test_batched_request_admitted_mid_chunk_finds_only_computed_steps_cached(cache_on_compute, expected):
    rep = batched(cache_on_compute)
    prompt = as_token_bytes(range(500))
    first = Job(0, 0.0, prompt, 3)
    rep.accept(first, 0.0)  # step 1 computes 200 of its 500 tokens
    second = Job(1, 0.001, prompt + as_token_bytes([9999]), 3)
    rep.accept(second, 0.001)  # admitted when step 2 starts (its match: 200 tokens, or 500 by default)
    # Step 2's budget goes to the first job's next 200 tokens. The second job's prefill begins in
    # step 3, next to the first's last 100: it is matched again then and finds 400 computed tokens.
    drain(rep, 0.0)

    assert first.matched == 0 and second.matched == expected
    assert rep.tree.pinned_tokens == 0 and not rep.tree.pinned_sequences() and rep._reserved == 0


def test_batched_same_step_duplicate_waits_one_step_and_hits():
    rep = batched(True, budget=4_096)
    prompt = as_token_bytes(range(1000))
    a, b = Job(0, 0.0, prompt, 2), Job(1, 0.0, prompt + as_token_bytes([7]), 2)
    rep.accept(a, 0.0)
    rep.accept(b, 0.0)
    assert rep.prefill_backlog(0.0) == 2 and len(rep._running) == 1
    drain(rep, 0.0)
    assert a.matched == 0 and b.matched == 1000 and b.start_s > a.start_s


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 300), st.integers(1, 8), st.floats(0.0, 0.05)),
        min_size=1,
        max_size=30,
    ),
    capacity=st.integers(1_500, 4_000),
    budget=st.integers(32, 1_024),
)
def test_batched_running_prefixes_stay_pinned_and_every_pin_is_released(jobs, capacity, budget):
    rep = batched(True, capacity=capacity, budget=budget)
    bases = [as_token_bytes(range(b * 10_000, b * 10_000 + n)) for b, n in enumerate((600, 1200, 40))]
    now, accepted = 0.0, []
    for i, (base, suffix, out, gap) in enumerate(jobs):
        drain(rep, now, until=now + gap)
        now += gap
        unique = as_token_bytes(range(500_000 + i * 1000, 500_000 + i * 1000 + suffix))
        job = Job(i, now, bases[base] + unique, out)
        rep.accept(job, now)
        accepted.append(job)
        for running in rep._running:
            held = len(running.pin_tokens) // 4
            assert held == min(running.total - running.prefill_left, len(running.tokens) // 4)
            assert rep.tree.match_prefix(running.tokens, touch=False).matched_tokens >= held
        assert rep.tree.cached_tokens + rep._reserved <= capacity
    drain(rep, now)

    assert all(not math.isnan(j.finish_s) for j in accepted)
    assert rep.tree.pinned_tokens == 0 and not rep.tree.pinned_sequences() and rep._reserved == 0


# -- configuration ------------------------------------------------------------------------------


def test_service_config_carries_the_mode_to_the_emulator_and_refuses_it_for_fifo():
    cfg = ServiceConfig("emulator", prefill_s_per_token=0.001, cache_on_compute=True)
    assert cfg.emulator_config(10_000).cache_on_compute is True
    assert cfg.as_dict()["cache_on_compute"] is True
    with pytest.raises(ValueError, match="cache_on_compute applies to the batched and emulator"):
        ServiceConfig("fifo", cache_on_compute=True)
    with pytest.raises(ValueError, match="cache_on_compute must be true or false"):
        EmulatorConfig(cache_on_compute="yes")  # type: ignore[arg-type]


def test_engine_flag_sets_the_mode_and_names_a_bad_value():
    args = argparse.Namespace(service=None, engine=["cache-on-compute=true"])
    assert service_config({"service": "batched"}, args).cache_on_compute is True
    args = argparse.Namespace(service=None, engine=["cache_on_compute=maybe"])
    with pytest.raises(UsageError, match="cache_on_compute must be true or false"):
        service_config({"service": "batched"}, args)


def test_the_emulator_cli_selects_the_insertion_timing() -> None:
    from prefixfleet.cli import build_parser
    from prefixfleet.emulator.cli import config_from_args

    parse = build_parser().parse_args
    assert config_from_args(parse(["emulator", "--port", "0", "--cache-on-compute"])).cache_on_compute is True
    assert config_from_args(parse(["emulator", "--port", "0"])).cache_on_compute is False


@pytest.mark.parametrize("cache_on_compute", [False, True])
def test_batched_empty_prompt_leaves_no_pin(cache_on_compute):
    rep = batched(cache_on_compute)
    job = Job(0, 0.0, b"", 2)
    rep.accept(job, 0.0)
    drain(rep, 0.0)
    assert not math.isnan(job.finish_s)  # served (a Job's times start as NaN, never None)
    assert rep.tree.pinned_tokens == 0 and not rep.tree.pinned_sequences() and rep._reserved == 0


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [("on", True), ("t", True), ("Y", True), ("TRUE", True), ("off", False), ("n", False), ("0", False)],
)
def test_engine_flag_reads_a_boolean_as_the_engines_json_fields_do(spelling: str, expected: bool) -> None:
    """--engine KEY=VALUE reads a boolean with prefixfleet.sglang_fields.lax_bool, as the gateway,
    sidecar and emulator read a request's bool fields: one set of spellings across the project."""
    args = argparse.Namespace(service=None, engine=[f"cache_on_compute={spelling}"])
    assert service_config({"service": "batched"}, args).cache_on_compute is expected
