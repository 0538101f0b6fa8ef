"""The engine model's cache-hit granularity: vLLM's whole blocks against SGLang's single tokens.

Specification (vLLM's kv_cache_manager.py get_computed_blocks): a hit is capped at the prompt less
one token (the last is recomputed for its logits) and counts only full blocks, so a repeat of an
n-token prompt reports floor((n - 1) / B) * B cached; the rest, partial block included, is prefilled.
Block size 1 is the SGLang face's rule (n - 1 on a repeat), unchanged.
"""

from __future__ import annotations

import pytest

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.engine import EngineModel, make_request, run_until_idle

CONFIG = EmulatorConfig(cache_tokens=10_000)


def repeat_hit(block_size: int, prompt: list[int], *, cache_on_compute: bool = False) -> tuple[int, float]:
    """(cached tokens, modelled prefill seconds) of a prompt's second run on an engine."""
    config = EmulatorConfig(cache_tokens=10_000, cache_on_compute=cache_on_compute)
    model = EngineModel(config, block_size)
    model.submit(make_request("first", prompt, 1, [7], 0.0))
    now, _ = run_until_idle(model, 0.0)
    second = make_request("second", prompt, 1, [7], now)
    model.submit(second)
    iteration = model.plan(now)
    assert iteration is not None
    model.commit(iteration, now + iteration.duration)
    return second.cached_tokens, iteration.duration


@pytest.mark.parametrize("cache_on_compute", [False, True])
@pytest.mark.parametrize(
    ("length", "block", "cached"), [(40, 16, 32), (48, 16, 32), (49, 16, 48), (40, 1, 39), (5, 16, 0)]
)
def test_a_repeat_hits_whole_blocks_short_of_the_prompt(
    length: int, block: int, cached: int, cache_on_compute: bool
):
    hit, _ = repeat_hit(block, list(range(1, length + 1)), cache_on_compute=cache_on_compute)
    assert hit == cached


def test_the_partial_block_is_prefilled_again():
    prompt = list(range(1, 1001))  # 999 matchable tokens: 62 blocks of 16 = 992 cached
    by_block, by_token = repeat_hit(16, prompt)[1], repeat_hit(1, prompt)[1]
    uncached_difference = (1000 - 992) - (1000 - 999)
    assert by_block - by_token == pytest.approx(
        uncached_difference / CONFIG.prefill_tokens_per_s - uncached_difference * CONFIG.cached_token_cost_s
    )


@pytest.mark.parametrize("bad", [0, -16, 1.5, True])
def test_a_block_size_that_is_no_positive_integer_is_refused(bad: object):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        EngineModel(CONFIG, bad)  # type: ignore[arg-type]
