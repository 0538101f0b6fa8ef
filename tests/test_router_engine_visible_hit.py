"""What a sidecar's mirror predicts for a request is the hit its engine reports, by each engine's rule.

Specification (engines' sources): SGLang matches a prompt against its radix cache only up to its
last token, which it always computes for the logits (``schedule_batch.py``: ``max_prefix_len =
input_len - 1`` in ``init_next_round_input``), so a prompt repeated exactly reports N - 1 cached
tokens, as the emulator's SGLang face does; vLLM reports whole blocks short of the last token
(``vllm_visible_hit``). The mirror predicts exactly that: a repeat adds nothing to
``overpredicted_tokens`` and evicts nothing from the mirror.

Auto-detection (``--engine-api auto``) with no engine key: vLLM run with ``--api-key`` guards only
its ``/v1`` routes (401), and has no ``/get_server_info`` (404); SGLang run with one guards every route
but ``/health*`` and ``/metrics*``. A 404 on ``/get_server_info`` beside a 401/403 on ``/v1/models`` is
therefore a keyed vLLM, not an SGLang: it is detected as vLLM (and the one warning names
``PREFIXFLEET_ENGINE_API_KEY``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fleet_fixtures import eventually, standalone_sidecar

from prefixfleet.emulator import EmulatorConfig, VllmOptions
from prefixfleet.emulator.server import EmulatorServer
from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.engine_api import SGLANG, VLLM, Probe, engine_visible_hit, pick_engine_api
from prefixfleet.router.sidecar import ENGINE_API_KEY_ENV
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

PROMPT = "the quick brown fox jumps over the lazy dog and keeps on running " * 8
KEY = "sk-engine-key"


def test_visible_hit_by_each_engines_rule() -> None:
    assert engine_visible_hit(SGLANG, 104, 104, 16) == 103  # a full repeat: the last token computed
    assert engine_visible_hit(SGLANG, 40, 104, 16) == 40  # SGLang's radix cache: to the token
    assert engine_visible_hit(SGLANG, 0, 104, 16) == 0
    assert engine_visible_hit(SGLANG, 1, 1, 16) == 0  # a one-token prompt: nothing reused
    assert engine_visible_hit(VLLM, 104, 104, 32) == 96  # whole blocks short of the last token
    assert engine_visible_hit(VLLM, 40, 104, 32) == 32


def test_a_keyed_vllm_refusing_the_models_probe_is_vllm() -> None:
    assert pick_engine_api(Probe(404), Probe(401)) == VLLM
    assert pick_engine_api(Probe(404), Probe(403)) == VLLM
    # a keyed SGLang refuses /get_server_info itself: still SGLang
    assert pick_engine_api(Probe(401), Probe(401)) == SGLANG
    assert pick_engine_api(Probe(404), Probe(404)) == SGLANG  # neither way, as before


@contextlib.asynccontextmanager
async def sidecar_before(engine: EmulatorServer, **settings: Any) -> AsyncIterator[tuple[str, Any]]:
    config = standalone_sidecar(engine.url, **({"model": None, "revision": None} | settings))
    async with sidecar_module.listening(config) as served:
        yield f"http://127.0.0.1:{served.port}", served.sidecar


# SGLang reuses a prompt to its last token, not through it: a repeat reports N-1 cached tokens, and
# the sidecar's prediction must say the same or the mirror sheds a token at each repeat.
async def test_sglang_repeats_are_predicted_as_reported_and_the_mirror_keeps_them() -> None:
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(EmulatorServer(EmulatorConfig(time_scale=1000.0)))
        url, car = await stack.enter_async_context(sidecar_before(engine))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
        assert car.s.engine.api == SGLANG
        n = len(tokenize(PROMPT))
        reported, held = [], []
        for _ in range(4):
            body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}}
            async with http.post(f"{url}/generate", json=body) as resp:
                assert resp.status == 200, await resp.text()
                reported.append((await resp.json())["meta_info"]["cached_tokens"])
            held.append(car.s.mirror.tree.cached_tokens)
        assert reported == [0, n - 1, n - 1, n - 1]  # SGLang's rule, as the emulator keeps it
        mirror = car.s.mirror
        assert mirror.compared_requests == 4
        assert mirror.predicted_tokens_total == mirror.reported_tokens_total == 3 * (n - 1)
        assert mirror.overpredicted_tokens_total == 0
        assert held == [held[0]] * 4  # nothing evicted from the mirror for the logits' token


async def test_auto_detects_a_keyed_vllm_without_the_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ENGINE_API_KEY_ENV, raising=False)
    options = VllmOptions(api_keys=(KEY,))
    async with EmulatorServer(EmulatorConfig(time_scale=1000.0), vllm=options) as engine:
        async with sidecar_before(engine, model="m") as (_url, car):
            await eventually(lambda: car.s.engine.known, 20, "the sidecar to decide the engine's API")
            assert car.s.engine.api == VLLM
        warned = [r.getMessage() for r in caplog.records if ENGINE_API_KEY_ENV in r.getMessage()]
        assert warned and "requires an API key" in warned[0]
