"""The emulator's scheduler model, driven on a virtual clock (pure: no I/O, no wall time)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.engine import (
    EngineModel,
    RequestRejected,
    RequestState,
    make_request,
    run_until_idle,
    shares_uncached_prefix,
)
from prefixfleet.router.radix import as_token_bytes


def config(**overrides: object) -> EmulatorConfig:
    base: dict[str, object] = dict(cache_tokens=10_000, chunk_tokens=2_048, max_running=8)
    base.update(overrides)
    return EmulatorConfig(**base)  # type: ignore[arg-type]


def output_ids(n: int, salt: int = 7) -> list[int]:
    return [10_000_000 + salt * 100_000 + i for i in range(n)]


def submit(model: EngineModel, rid: str, prompt: list[int], max_new: int, now: float = 0.0):
    request = make_request(rid, prompt, max_new, output_ids(max_new, zlib.crc32(rid.encode()) % 90), now)
    model.submit(request)
    return request


def ttft(request) -> float:
    return request.first_token_at - request.arrival


SHARED = list(range(1, 3001))  # a 3000-token system prompt


def test_repeated_prompt_is_served_from_cache_and_its_first_token_comes_sooner():
    model = EngineModel(config())
    cold = submit(model, "cold", [*SHARED, 5001, 5002], 4)
    now, _ = run_until_idle(model, 0.0)
    warm = submit(model, "warm", [*SHARED, 6001, 6002, 6003], 4, now)
    run_until_idle(model, now)

    assert cold.cached_tokens == 0
    assert warm.cached_tokens == len(SHARED)  # exactly the shared prefix, not the differing suffix
    assert ttft(warm) < ttft(cold)


@pytest.mark.parametrize("cache_on_compute", [False, True])
@pytest.mark.parametrize("max_new_tokens", [0, 2])
def test_fully_repeated_prompt_computes_its_last_token_as_sglang_does(
    cache_on_compute: bool, max_new_tokens: int
):
    # SGLang matches at most the prompt less its last token (Req.adjust_max_prefix_ids), prefill-only
    # requests included: an exact repeat reports prompt - 1 cached tokens and prefills one
    cfg = config(cache_on_compute=cache_on_compute)
    model = EngineModel(cfg)
    prompt = list(range(100, 600))
    submit(model, "a", prompt, 2)
    now, _ = run_until_idle(model, 0.0)
    again = submit(model, "b", prompt, max_new_tokens, now)
    end, _ = run_until_idle(model, now)
    assert again.cached_tokens == len(prompt) - 1 and again.computed_tokens == 1
    # the pass that admits it computes that one token (it runs alone: no decode step in it)
    assert again.first_token_at - now == pytest.approx(cfg.prefill_seconds(1, len(prompt) - 1))
    assert model.tree.pinned_tokens == 0
    assert model.tree.matched_tokens(prompt) == len(prompt)  # still cached whole for the next one
    single = submit(model, "c", [42], 1, end)
    run_until_idle(model, end)
    assert single.cached_tokens == 0  # a 1-token prompt never hits


def test_generated_tokens_extend_the_cache_so_the_next_turn_hits_them():
    model = EngineModel(config())
    first = submit(model, "turn1", list(range(1, 401)), 30)
    now, _ = run_until_idle(model, 0.0)
    history = list(range(1, 401)) + output_ids(30, zlib.crc32(b"turn1") % 90)
    second = submit(model, "turn2", [*history, 777, 778], 5, now)
    run_until_idle(model, now)
    assert first.generated == 30
    assert second.cached_tokens == len(history)


def test_long_uncached_prompt_is_prefilled_in_chunks():
    model = EngineModel(config(chunk_tokens=1_000))
    request = submit(model, "long", list(range(1, 3501)), 1)
    passes = 0
    now = 0.0
    while (it := model.plan(now)) is not None:
        passes += 1
        assert sum(p.new_tokens for p in it.prefill) <= 1_000
        now += it.duration
        model.commit(it, now)
    assert passes == 4  # 1000 + 1000 + 1000 + 500
    assert request.state is RequestState.FINISHED


def test_waiting_requests_are_admitted_first_come_first_served():
    model = EngineModel(config(chunk_tokens=1_000))
    order = [submit(model, f"r{i}", list(range(i * 10_000, i * 10_000 + 900)), 3) for i in range(4)]
    run_until_idle(model, 0.0)
    starts = [r.prefill_started_at for r in order]
    firsts = [r.first_token_at for r in order]
    assert starts == sorted(starts)
    # 900-token prompts in 1000-token passes: each pass finishes one prompt and starts the next
    # with the leftover budget (chunked prefill), so first tokens come one pass apart, in order.
    assert firsts == sorted(firsts) and len(set(firsts)) == 4
    assert order[1].prefill_started_at == order[0].prefill_started_at


def test_decode_runs_as_one_batch_step_per_iteration():
    model = EngineModel(config())
    a = submit(model, "a", list(range(1, 50)), 6)
    b = submit(model, "b", list(range(100, 150)), 6)
    now = 0.0
    first = model.plan(now)
    assert {p.request.rid for p in first.prefill} == {"a", "b"}  # both fit in one prefill pass
    now += first.duration
    model.commit(first, now)
    step = model.plan(now)
    assert step.prefill == () and {r.rid for r in step.decode} == {"a", "b"}
    assert step.duration == pytest.approx(model.config.decode_seconds(2))
    now += step.duration
    model.commit(step, now)
    assert a.generated == b.generated == 2


def test_prefill_only_request_finishes_after_prefill_and_leaves_its_prompt_cached():
    model = EngineModel(config())
    warm = submit(model, "warm", SHARED, 0)
    now, events = run_until_idle(model, 0.0)
    assert warm.state is RequestState.FINISHED and warm.generated == 0
    assert [(p.first, p.finished, p.new_tokens) for _, p in events] == [(True, True, 0)]
    assert model.tree.matched_tokens(SHARED) == len(SHARED)
    later = submit(model, "later", [*SHARED, 42], 1, now)
    run_until_idle(model, now)
    assert later.cached_tokens == len(SHARED)


def test_least_recently_used_prefixes_are_evicted_when_the_cache_is_full():
    model = EngineModel(config(cache_tokens=2_000, chunk_tokens=2_048))
    a, b, c = list(range(1, 801)), list(range(10_001, 10_801)), list(range(20_001, 20_801))
    now = 0.0
    for rid, prompt in (("a", a), ("b", b), ("a-again", a), ("c", c)):
        submit(model, rid, prompt, 1, now)
        now, _ = run_until_idle(model, now)
        assert model.tree.cached_tokens <= 2_000
    # "b" was least recently used when "c" needed room; "a" was refreshed by its repeat.
    assert model.tree.matched_tokens(b) < len(b)
    assert model.tree.matched_tokens(a) == len(a)
    assert model.tree.matched_tokens(c) == len(c)


def test_a_running_requests_prefix_is_never_evicted_and_newcomers_wait_for_memory():
    model = EngineModel(config(cache_tokens=2_000, chunk_tokens=2_048))
    first = submit(model, "first", list(range(1, 1_201)), 20)
    second = submit(model, "second", list(range(50_000, 51_200)), 20)  # cannot fit beside the first
    now = 0.0
    while first.state is not RequestState.FINISHED:
        it = model.plan(now)
        now += it.duration
        model.commit(it, now)
        if first.state is not RequestState.FINISHED:
            assert model.tree.matched_tokens(first.prompt) == first.prompt_tokens
            assert second.state is RequestState.WAITING
    run_until_idle(model, now)
    assert second.prefill_started_at >= first.finished_at
    assert second.state is RequestState.FINISHED


def test_running_request_cap_holds_back_extra_requests():
    model = EngineModel(config(max_running=2))
    reqs = [submit(model, f"r{i}", list(range(i * 1000 + 1, i * 1000 + 11)), 5) for i in range(3)]
    it = model.plan(0.0)
    assert [p.request.rid for p in it.prefill] == ["r0", "r1"]
    assert reqs[2].state is RequestState.WAITING
    model.commit(it, it.duration)
    run_until_idle(model, it.duration)
    assert all(r.state is RequestState.FINISHED for r in reqs)


def test_flush_is_refused_while_requests_run_and_empties_the_cache_when_idle():
    model = EngineModel(config())
    submit(model, "busy", SHARED, 3)
    assert model.flush() is False
    now, _ = run_until_idle(model, 0.0)
    assert model.tree.cached_tokens > 0
    assert model.flush() is True
    assert model.tree.cached_tokens == 0
    again = submit(model, "again", SHARED, 1, now)
    run_until_idle(model, now)
    assert again.cached_tokens == 0


def test_abort_releases_the_pin_and_the_reservation():
    model = EngineModel(config())
    victim = submit(model, "victim", SHARED, 50)
    it = model.plan(0.0)
    model.commit(it, it.duration)
    assert model.tree.pinned_tokens == len(SHARED) and model.reserved_decode_tokens == 50
    assert model.abort("victim") is True
    assert victim.state is RequestState.ABORTED
    assert model.tree.pinned_tokens == 0 and model.reserved_decode_tokens == 0
    assert model.abort("victim") is False
    assert model.plan(it.duration) is None


def test_requests_that_can_never_fit_are_rejected_up_front():
    model = EngineModel(config(cache_tokens=1_000))
    with pytest.raises(RequestRejected, match="exceeds the KV cache capacity"):
        submit(model, "huge", list(range(1, 990)), 100)
    with pytest.raises(RequestRejected, match="at least one token"):
        submit(model, "empty", [], 1)
    submit(model, "dup", [1, 2, 3], 1)
    with pytest.raises(RequestRejected, match="already in use"):
        submit(model, "dup", [4, 5], 1)


def test_stats_report_queue_usage_and_hit_rate():
    model = EngineModel(config(max_running=1))
    submit(model, "a", SHARED, 3)
    submit(model, "b", SHARED, 3)
    it = model.plan(0.0)
    stats = model.stats(0.0)
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert stats.num_used_tokens >= len(SHARED) and 0 < stats.token_usage <= 1
    model.commit(it, it.duration)
    now, _ = run_until_idle(model, it.duration)
    stats = model.stats(now)
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    # second request cached but for its last token (as SGLang), first cold
    assert stats.cache_hit_rate == pytest.approx((len(SHARED) - 1) / (2 * len(SHARED)))
    assert stats.gen_throughput > 0


@pytest.mark.parametrize("cache_on_compute", [False, True])
def test_token_usage_is_the_pool_room_running_requests_hold_computed_or_not(cache_on_compute: bool):
    # SGLang's num_used_tokens is its pool less the free and the evictable room. Here a running
    # request holds room for its whole prompt and its max_new_tokens from admission on (what the
    # scheduler keeps for it), in both modes, however much of its prompt is computed yet
    cap = 10_000
    model = EngineModel(config(cache_tokens=cap, chunk_tokens=1_000, cache_on_compute=cache_on_compute))
    submit(model, "cold", SHARED, 50)  # 3000 prompt tokens: three prefill passes
    now, usage = 0.0, []
    while (it := model.plan(now)) is not None:
        usage.append(model.stats(now).num_used_tokens)
        now += it.duration
        model.commit(it, now)
    assert set(usage) == {len(SHARED) + 50} and len(usage) == 3 + 49  # prefill passes, then decode
    assert model.stats(now).num_used_tokens == 0  # finished: what it left cached is evictable

    # running requests sharing a cached prefix hold it once
    warm = submit(model, "warm", [*SHARED, *range(7001, 7011)], 5, now)
    other = submit(model, "other", [*SHARED, *range(8001, 8021)], 5, now)
    model.plan(now)
    assert warm.cached_tokens == other.cached_tokens == len(SHARED)
    stats = model.stats(now)
    assert stats.num_used_tokens == len(SHARED) + (10 + 5) + (20 + 5)
    assert stats.token_usage == pytest.approx(stats.num_used_tokens / cap)


@pytest.mark.parametrize(
    "field,value",
    [("cache_tokens", 0), ("time_scale", 0.0), ("chunk_tokens", -1), ("prefill_tokens_per_s", float("inf"))],
)
def test_config_rejects_nonsense_naming_the_field(field: str, value: object):
    with pytest.raises(ValueError, match=field):
        EmulatorConfig(**{field: value})  # type: ignore[arg-type]


# -- invariants under random workloads ---------------------------------------------------------------


# A few tenants' prefixes, each request one prefix plus a short unique suffix.
_prefixes = [list(range(t * 100_000, t * 100_000 + n)) for t, n in enumerate((300, 900, 1500, 50))]
_ops = st.lists(
    st.tuples(
        st.sampled_from(["submit", "submit", "submit", "step", "step", "abort"]),
        st.integers(0, 3),  # tenant
        st.integers(1, 200),  # suffix length
        st.integers(0, 40),  # max_new_tokens
    ),
    min_size=1,
    max_size=60,
)


@pytest.mark.parametrize("cache_on_compute", [False, True])
@settings(max_examples=50, deadline=None)
@given(ops=_ops, cache=st.integers(2_500, 6_000), chunk=st.integers(64, 2_048), max_running=st.integers(1, 6))
def test_pool_never_overflows_fifo_holds_and_everything_is_released(
    cache_on_compute, ops, cache, chunk, max_running
):
    model = EngineModel(
        config(
            cache_tokens=cache, chunk_tokens=chunk, max_running=max_running, cache_on_compute=cache_on_compute
        )
    )
    now, submitted, seq = 0.0, [], 0
    for op, tenant, suffix, max_new in ops:
        if op == "submit":
            seq += 1
            prompt = [*_prefixes[tenant], *range(900_000 + seq * 1000, 900_000 + seq * 1000 + suffix)]
            try:
                submitted.append(submit(model, f"r{seq}", prompt, max_new, now))
            except RequestRejected:
                assert len(prompt) + max_new > cache
        elif op == "step" and (it := model.plan(now)) is not None:
            now += it.duration
            model.commit(it, now)
        elif op == "abort" and submitted:
            model.abort(submitted[tenant % len(submitted)].rid)
        held = model.tree.cached_tokens + model.reserved_prefill_tokens + model.reserved_decode_tokens
        assert held <= cache
        assert 0 <= model.stats(now).num_used_tokens <= cache
        assert model.num_running <= max_running
        for request in [*model.prefilling.values(), *model.decoding.values()]:
            computed = request.cached_tokens + request.computed_tokens
            # a running request's computed tokens (only those with cache_on_compute) stay pinned
            assert request.pinned == (computed if cache_on_compute else request.prompt_tokens)
            assert model.tree.match_prefix(request.prompt, touch=False).matched_tokens >= request.pinned
    now, _ = run_until_idle(model, now)

    assert model.idle and model.tree.pinned_tokens == 0 and not model.tree.pinned_sequences()
    assert model.reserved_decode_tokens == model.reserved_prefill_tokens == 0
    finished = [r for r in submitted if r.state is RequestState.FINISHED]
    assert all(r.generated == r.max_new_tokens and r.pinned == 0 for r in finished)
    assert all(0 <= r.cached_tokens <= r.prompt_tokens for r in finished)
    assert all(r.arrival <= r.first_token_at <= r.finished_at for r in finished)
    starts = [r.prefill_started_at for r in finished]
    if not cache_on_compute:  # there a request sharing a prefix being computed may wait one pass
        assert starts == sorted(starts)  # first come, first served


# -- rules found unpinned by breaking them on purpose ----------------------------------------------


def test_a_prefill_pass_costs_overhead_plus_uncached_tokens_plus_a_lookup_per_cached_token():
    model = EngineModel(
        config(prefill_overhead_s=0.5, prefill_tokens_per_s=1_000.0, cached_token_cost_s=0.001)
    )
    prompt = list(range(1, 101))
    submit(model, "a", prompt, 1)
    now, _ = run_until_idle(model, 0.0)
    submit(model, "b", [*prompt, *range(500, 510)], 1, now)
    it = model.plan(now)
    # 100 cached tokens looked up, 10 computed; no decode in the pass
    assert it.duration == pytest.approx(0.5 + 10 / 1_000 + 100 * 0.001)


def test_admission_reserves_room_for_the_tokens_a_request_will_generate():
    model = EngineModel(config(cache_tokens=1_000))
    first = submit(model, "first", list(range(1, 501)), 400)  # 500 prompt + 400 to generate
    # 50 + 100 more would not fit beside 900 reserved: it waits although the tree holds only 500
    second = submit(model, "second", list(range(5_000, 5_050)), 100)
    it = model.plan(0.0)
    assert [p.request.rid for p in it.prefill] == ["first"]
    model.commit(it, it.duration)
    assert second.state is RequestState.WAITING
    run_until_idle(model, it.duration)
    assert second.prefill_started_at >= first.finished_at


def test_a_request_deferred_for_a_shared_prefix_keeps_its_place_in_the_queue():
    model = EngineModel(config(cache_tokens=10_000, chunk_tokens=8_192, cache_on_compute=True))
    shared = list(range(1, 101))
    submit(model, "a", [*shared, 1_001], 10)
    submit(model, "b", [*shared, 1_002], 10)  # shares 100 uncached tokens with a: waits one pass
    submit(model, "c", [*shared, 1_003], 10)
    submit(model, "big", list(range(20_000, 29_890)), 10)  # no room beside a's reservation: blocks
    submit(model, "late", [7], 1)
    it = model.plan(0.0)
    assert [p.request.rid for p in it.prefill] == ["a"]
    assert [r.rid for r in model.waiting] == ["b", "c", "big", "late"]


def test_a_prefix_shared_with_the_pass_defers_only_from_32_uncached_tokens():
    other = as_token_bytes(range(100))
    assert shares_uncached_prefix(as_token_bytes([*range(32), 999]), 0, [other])
    assert not shares_uncached_prefix(as_token_bytes([*range(31), 999]), 0, [other])
    # counted beyond what is cached already: 10 cached + 31 shared is not enough
    assert not shares_uncached_prefix(as_token_bytes([*range(41), 999]), 10, [other])
    assert shares_uncached_prefix(as_token_bytes([*range(42), 999]), 10, [other])


def test_a_request_waiting_for_memory_leaves_the_cache_untouched():
    """Its cached prefix cannot be evicted to make room for itself, so it waits: and meanwhile none
    of its uncomputed tokens may appear in the tree (another request would match them)."""
    model = EngineModel(config(cache_tokens=1_000))
    shared = list(range(1, 601))
    submit(model, "x", shared, 1)
    now, _ = run_until_idle(model, 0.0)  # 601 tokens cached, nothing pinned
    submit(model, "r", list(range(5_000, 5_200)), 100, now)  # runs: pins 200, reserves 100
    it = model.plan(now)
    now += it.duration
    model.commit(it, now)
    b = submit(model, "b", [*shared, *range(9_000, 9_150)], 10, now)
    before = (model.tree.cached_tokens, model.tree.pinned_tokens)
    it = model.plan(now)
    # 801 cached + 150 new + 110 reserved > 1000, and only 1 token is neither pinned nor b's prefix
    assert b.state is RequestState.WAITING and all(p.request is not b for p in it.prefill)
    assert (model.tree.cached_tokens, model.tree.pinned_tokens) == before
    assert model.tree.matched_tokens(b.prompt) == 600
