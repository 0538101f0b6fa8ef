"""A batch of prompts through the sidecar: its mirror records only what the engine caches.

Specification:
* a batch is mirrored by its first prompt, under that prompt's ``cache_salt`` (the engine caches
  each prompt under its own); after the answer the mirror holds, under that salt, the first prompt
  and at most the first prompt's output: never another prompt's output appended to it;
* this holds for /generate and /v1/completions, answered whole or streamed (a streamed batch
  interleaves its prompts' events; the last text seen may be another prompt's);
* a batch's cached-token count (per prompt, or summed in completions' usage) is never compared
  with the first prompt's prediction: the mirror's correction learns from single prompts only;
* the load tracker is told what the engine prefilled for the whole batch: /generate's per-prompt
  counts summed, as completions' usage already sums them.
"""

from __future__ import annotations

import aiohttp
import pytest
from fleet_fixtures import standalone_sidecar
from openai_usage import cached_tokens

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer
from prefixfleet.router.loadtrack import LoadTracker
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.sidecar import listening
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

FIRST = " ".join(f"alpha{i}" for i in range(40))
SECOND = " ".join(f"bravo{i}" for i in range(40))
FIRST_OUTPUT = 2  # the first prompt's output is short, the second's long: a mix-up shows
SECOND_OUTPUT = 30


def _batch(path: str, stream: bool) -> dict[str, object]:
    salted = {"cache_salt": ["A", "B"], "stream": stream}
    if path == "/generate":
        sampling = [{"max_new_tokens": FIRST_OUTPUT}, {"max_new_tokens": SECOND_OUTPUT}]
        return {"text": [FIRST, SECOND], "sampling_params": sampling, **salted}
    # /v1/completions takes one max_tokens for every prompt
    return {"prompt": [FIRST, SECOND], "max_tokens": FIRST_OUTPUT, **salted}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
async def test_a_batch_is_mirrored_as_its_first_prompt_and_that_prompts_output_only(
    path: str, stream: bool
) -> None:
    async with EmulatorServer(EmulatorConfig(time_scale=1000.0, enable_cache_report=True)) as engine:
        config = standalone_sidecar(engine.url)
        async with listening(config) as served, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{served.port}{path}"
            async with http.post(url, json=_batch(path, stream)) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            tree = served.sidecar.s.mirror.tree
            first = as_token_bytes(tokenize(FIRST))
            first_tokens = len(first) // 4
            assert tree.matched_tokens(first, "A") == first_tokens
            assert tree.matched_tokens(first, "B") == 0
            assert first_tokens <= tree.cached_tokens <= first_tokens + FIRST_OUTPUT


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
async def test_a_batchs_cached_count_is_not_compared_with_its_first_prompts_prediction(
    path: str, stream: bool
) -> None:
    # The engine reports a batch's cached tokens per prompt (/generate) or summed (completions'
    # usage); either way not the first prompt's alone. Here the second prompt is the cached one:
    # read as the first prompt's, it would hide an over-prediction of the first.
    async with EmulatorServer(EmulatorConfig(time_scale=1000.0, enable_cache_report=True)) as engine:
        config = standalone_sidecar(engine.url)
        async with listening(config) as served, aiohttp.ClientSession() as http:
            warm = {"text": SECOND, "cache_salt": "B", "sampling_params": {"max_new_tokens": 1}}
            async with http.post(f"{engine.url}/generate", json=warm) as resp:
                assert resp.status == 200, await resp.text()
            body = _batch(path, stream)
            if path == "/v1/completions" and stream:
                body["stream_options"] = {"include_usage": True}
            url = f"http://127.0.0.1:{served.port}{path}"
            async with http.post(url, json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert b"cached_tokens" in await resp.read()
            mirror = served.sidecar.s.mirror
            assert mirror.compared_requests == 0
            assert mirror.reported_tokens_total == 0


class ReportedLoad(LoadTracker):
    """The sidecar's load tracker, keeping each prefill count the engine's answers reported."""

    def __init__(self) -> None:
        super().__init__()
        self.reported: list[int] = []

    def report_uncached(self, handle: int, uncached_tokens: int) -> None:
        self.reported.append(uncached_tokens)
        super().report_uncached(handle, uncached_tokens)


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
async def test_a_whole_batchs_prefill_is_reported_summed_over_its_prompts(path: str) -> None:
    # The load tracker's rate sample wants what the engine prefilled for the whole request. The
    # second prompt is cached, the first not: the last prompt's count alone would read ~0 tokens.
    async with EmulatorServer(EmulatorConfig(time_scale=1000.0, enable_cache_report=True)) as engine:
        config = standalone_sidecar(engine.url)
        async with listening(config) as served, aiohttp.ClientSession() as http:
            load = ReportedLoad()
            served.sidecar.s.load = load
            warm = {"text": SECOND, "cache_salt": "B", "sampling_params": {"max_new_tokens": 1}}
            async with http.post(f"{engine.url}/generate", json=warm) as resp:
                assert resp.status == 200, await resp.text()
            url = f"http://127.0.0.1:{served.port}{path}"
            async with http.post(url, json=_batch(path, stream=False)) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
    if path == "/generate":
        counts = [(item["meta_info"]["prompt_tokens"], item["meta_info"]["cached_tokens"]) for item in answer]
        assert counts[0][1] == 0 and counts[1][1] > 0  # as set up: only the second prompt was cached
        prefilled = sum(prompt - cached for prompt, cached in counts)
    else:
        usage = answer["usage"]  # summed over the prompts by the engine
        prefilled = usage["prompt_tokens"] - cached_tokens(usage)
    assert load.reported == [prefilled]
    assert prefilled >= len(tokenize(FIRST))
