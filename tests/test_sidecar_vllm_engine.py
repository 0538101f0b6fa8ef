"""The sidecar in front of a vLLM engine (``--engine-api auto|vllm``), against a small fake vLLM.

Specification (vLLM facts checked in vllm-project/vllm's source, see router/engine_api.py):
* auto-detection: ``/get_server_info`` answering a JSON object is SGLang, else ``/v1/models``
  answering 200 is vLLM; an engine that answers neither way stays SGLang (today's behaviour); no
  answer decides nothing;
* identity and capacity in front of vLLM: the model is ``/v1/models`` ``data[0].id`` (``--model``
  wins), the revision ``--revision`` or empty, the mirror's capacity ``block_size * num_gpu_blocks``
  of ``vllm:cache_config_info`` (``--cache-tokens`` wins) and its block size the engine's
  ``block_size`` (``--block-tokens`` wins);
* a repeated prompt's second answer reports whole blocks short of the last token cached, and the
  mirror predicts exactly that: nothing over-predicted, nothing evicted from the mirror;
* the idle reconciliation (SGLang's ``/get_server_info``) is never polled in front of vLLM;
* the sidecar's ``/flush_cache`` is vLLM's ``POST /reset_prefix_cache``: a 404 (no
  ``VLLM_SERVER_DEV_MODE=1``) is a 501 naming that variable, and the mirror is kept; a 200 empties it;
* pre-warming replays the holder's kept request for a prefix (a ``/v1/completions`` of the client's
  text) with ``max_tokens: 1``, through the sidecar (so its mirror records it), and the engine then
  holds it; a kept SGLang ``/generate`` on a vLLM replica becomes a ``/v1/completions`` with the
  served model name.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, free_port, serve_aiohttp, standalone_sidecar

from prefixfleet.cli import build_parser
from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.blockhash import CacheIdentity, block_hashes
from prefixfleet.router.engine_api import (
    SGLANG,
    VLLM,
    Probe,
    mirror_block_tokens,
    pick_engine_api,
    vllm_cache_config,
    vllm_served_model,
    vllm_visible_hit,
)
from prefixfleet.router.prewarm import prefill_request
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

SERVED = "served-model"
BLOCK = 32
GPU_BLOCKS = 100
PROMPT = "the quick brown fox jumps over the lazy dog and keeps on running " * 8  # 104 tokens


def cache_config_text(**labels: object) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{shown}}} 1.0\n"
    )


# -- pure decisions ------------------------------------------------------------------------------


def test_auto_detection_from_the_two_probes() -> None:
    sglang_info = Probe(200, {"max_total_num_tokens": 1000})
    assert pick_engine_api(sglang_info, None) == SGLANG
    assert pick_engine_api(Probe(404), Probe(200, {"data": []})) == VLLM
    assert pick_engine_api(Probe(200, [1, 2]), Probe(200)) == VLLM  # 200 but no JSON object
    assert pick_engine_api(Probe(404), Probe(404)) == SGLANG  # answers, but neither way
    assert pick_engine_api(Probe(None), None) is None  # not answering: ask again
    assert pick_engine_api(Probe(404), Probe(None)) is None
    assert pick_engine_api(Probe(404), None) is None


def test_served_model_name() -> None:
    assert vllm_served_model({"object": "list", "data": [{"id": "a"}, {"id": "b"}]}) == "a"
    for body in (None, [], {"data": []}, {"data": [{"id": 3}]}, {"data": "x"}, {"data": [{"id": ""}]}):
        assert vllm_served_model(body) is None


def test_capacity_from_cache_config_info() -> None:
    text = cache_config_text(block_size=16, engine=0, num_gpu_blocks=1000, num_cpu_blocks="None")
    cache = vllm_cache_config(text + 'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n')
    assert (cache.block_size, cache.match_unit, cache.capacity_tokens) == (16, 16, 16_000)
    # newer vLLM states the capacity itself (group-aware), and where hits land
    newer = vllm_cache_config(
        cache_config_text(block_size=64, num_gpu_blocks=10, kv_cache_size_tokens=500, prefix_match_unit=32)
    )
    assert (newer.block_size, newer.match_unit, newer.capacity_tokens) == (64, 32, 500)
    # not profiled yet: no capacity, the block size still known
    assert vllm_cache_config(cache_config_text(block_size=16, num_gpu_blocks="None")).capacity_tokens is None
    # data parallel: one series per engine, a prompt lands in one of them
    two = cache_config_text(block_size=16, engine=0, num_gpu_blocks=10) + (
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="8"} 1.0\n'
    )
    assert vllm_cache_config(two).capacity_tokens == 128


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("vllm:num_requests_running 0\n", "no vllm:cache_config_info"),
        (cache_config_text(num_gpu_blocks=10), "no block_size"),
        (cache_config_text(block_size="16k", num_gpu_blocks=10), "block_size='16k' is not an integer"),
        (cache_config_text(block_size=0, num_gpu_blocks=10), "block_size='0' is not positive"),
        ("vllm:cache_config_info{block_size=16 1\n", "not a Prometheus text exposition"),
    ],
)
def test_bad_cache_config_is_named(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        vllm_cache_config(text)


def test_visible_hit_is_whole_blocks_short_of_the_last_token() -> None:
    assert vllm_visible_hit(104, 104, 32) == 96  # a full repeat: the last token is recomputed
    assert vllm_visible_hit(96, 96, 32) == 64  # ...even when the prompt ends on a block boundary
    assert vllm_visible_hit(40, 104, 32) == 32  # a partial block is not a hit
    assert vllm_visible_hit(0, 104, 32) == 0
    assert vllm_visible_hit(5, 1, 16) == 0


def test_mirror_block_tokens() -> None:
    assert mirror_block_tokens(None, VLLM, 32) == 32
    assert mirror_block_tokens(8, VLLM, 32) == 8  # --block-tokens wins
    assert mirror_block_tokens(None, SGLANG, None) == 16
    assert mirror_block_tokens(None, VLLM, None) == 16  # the engine stated no block size


def test_prefill_request_per_api() -> None:
    kept = {"path": "/generate", "body": {"input_ids": [1, 2], "cache_salt": "t1"}}
    assert prefill_request(VLLM, kept, SERVED) == (
        "/v1/completions",
        {"prompt": [1, 2], "max_tokens": 1, "cache_salt": "t1", "model": SERVED},
    )
    kept = {"path": "/generate", "body": {"input_ids": [1, 2]}}
    assert prefill_request(VLLM, kept, "") == ("/v1/completions", {"prompt": [1, 2], "max_tokens": 1})
    assert prefill_request(SGLANG, kept, "") == (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}},
    )


# -- a fake vLLM engine --------------------------------------------------------------------------


@dataclass
class FakeVllm:
    """vLLM's routes as its source has them: no SGLang routes (404), a block-granular prefix cache
    reporting whole blocks short of the last token, ``/reset_prefix_cache`` only in dev mode."""

    dev_mode: bool = False
    hits: Counter[str] = field(default_factory=Counter)
    completions: list[dict[str, Any]] = field(default_factory=list)
    cached: set[tuple[str | None, tuple[int, ...]]] = field(default_factory=set)  # (salt, block chain)

    def app(self) -> web.Application:
        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            self.hits[f"{request.method} {request.path}"] += 1
            return await handler(request)

        app = web.Application(middlewares=[count])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.complete)
        if self.dev_mode:
            app.router.add_post("/reset_prefix_cache", self.reset)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response()  # vLLM's: 200, empty

    async def models(self, _request: web.Request) -> web.Response:
        model = {"id": SERVED, "object": "model", "owned_by": "vllm", "root": "/models/x", "parent": None}
        return web.json_response({"object": "list", "data": [model]})

    async def metrics(self, _request: web.Request) -> web.Response:
        text = cache_config_text(block_size=BLOCK, engine=0, num_gpu_blocks=GPU_BLOCKS, num_cpu_blocks="None")
        return web.Response(text=text, content_type="text/plain")

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.completions.append(body)
        if not isinstance(body.get("max_tokens", 16), int) or body.get("max_tokens", 16) < 1:
            return web.json_response({"error": {"message": "max_tokens must be at least 1"}}, status=400)
        prompt = body["prompt"]
        ids = list(prompt) if isinstance(prompt, list) else list(tokenize(prompt))
        salt = body.get("cache_salt")
        hit = 0
        for end in range(BLOCK, len(ids), BLOCK):  # whole blocks, never the last token
            if (salt, tuple(ids[:end])) not in self.cached:
                break
            hit = end
        self.cached.update((salt, tuple(ids[:end])) for end in range(BLOCK, len(ids) + 1, BLOCK))
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": 1,
            "total_tokens": len(ids) + 1,
            "prompt_tokens_details": {"cached_tokens": hit},
        }
        choice = {"index": 0, "text": " ok", "finish_reason": "length"}
        return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage})

    async def reset(self, _request: web.Request) -> web.Response:
        self.cached.clear()
        return web.Response(status=200)


@contextlib.asynccontextmanager
async def vllm_sidecar(
    engine: FakeVllm, **settings: Any
) -> AsyncIterator[tuple[str, sidecar_module.Sidecar]]:
    """The fake engine and a sidecar in front of it (no Redis), once the sidecar knows the engine."""
    async with serve_aiohttp(engine.app()) as engine_url:
        asked = {"model": None, "revision": None, "cache_tokens": None}  # from the engine
        config = standalone_sidecar(engine_url, **asked | settings)
        async with sidecar_module.listening(config) as served:
            car = served.sidecar
            await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
            yield f"http://127.0.0.1:{served.port}", car


async def complete(http: aiohttp.ClientSession, url: str, prompt: object) -> dict[str, Any]:
    async with http.post(f"{url}/v1/completions", json={"model": SERVED, "prompt": prompt}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_auto_detects_vllm_and_reads_its_identity_and_capacity() -> None:
    engine = FakeVllm()
    async with vllm_sidecar(engine) as (url, car), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/prefixfleet/status") as resp:
            status = await resp.json()
        assert (status["engine_api"], status["model"], status["revision"]) == (VLLM, SERVED, "")
        assert status["block_tokens"] == BLOCK
        assert car.load_report().capacity_tokens == BLOCK * GPU_BLOCKS
        assert car.member_record().block_tokens == BLOCK
        assert engine.hits["GET /get_server_info"] == 1  # the probe that said "not SGLang"


async def test_given_flags_win_over_what_vllm_states() -> None:
    engine = FakeVllm()
    settings = {"engine_api": VLLM, "model": "org/model", "revision": "abc", "cache_tokens": 777}
    settings["block_tokens"] = 8
    async with vllm_sidecar(engine, **settings) as (_url, car):
        e = car.s.engine
        assert (e.api, e.model, e.revision, e.served_model) == (VLLM, "org/model", "abc", SERVED)
        assert (car.s.mirror.tree.capacity_tokens, car.s.mirror.block_tokens) == (777, 8)
        assert engine.hits["GET /get_server_info"] == 0  # told, not detected


async def test_a_repeat_is_predicted_as_vllm_reports_it_and_the_mirror_keeps_it() -> None:
    engine = FakeVllm()
    async with vllm_sidecar(engine) as (url, car), aiohttp.ClientSession() as http:
        first = await complete(http, url, PROMPT)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        held = car.s.mirror.tree.cached_tokens
        second = await complete(http, url, PROMPT)
        n = len(tokenize(PROMPT))
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK
        mirror = car.s.mirror
        assert mirror.compared_requests == 2
        assert mirror.predicted_tokens_total == mirror.reported_tokens_total == (n - 1) // BLOCK * BLOCK
        assert mirror.overpredicted_tokens_total == 0
        assert mirror.tree.cached_tokens >= held  # nothing evicted for a difference of granularity


async def test_no_reconciliation_polling_in_front_of_vllm() -> None:
    engine = FakeVllm()
    async with vllm_sidecar(engine):
        rounds = engine.hits["GET /health"]
        await eventually(lambda: engine.hits["GET /health"] >= rounds + 2, 20, "two more health rounds")
        assert engine.hits["GET /get_server_info"] == 1  # the detection probe only


async def test_flush_without_dev_mode_is_a_clear_error_and_keeps_the_mirror() -> None:
    engine = FakeVllm(dev_mode=False)
    async with vllm_sidecar(engine) as (url, car), aiohttp.ClientSession() as http:
        await complete(http, url, PROMPT)
        held = car.s.mirror.tree.cached_tokens
        assert held > 0
        async with http.post(f"{url}/flush_cache") as resp:
            assert resp.status == 501
            error = (await resp.json())["error"]
        assert "VLLM_SERVER_DEV_MODE=1" in error["message"]
        assert engine.hits["POST /reset_prefix_cache"] == 1
        assert car.s.mirror.tree.cached_tokens == held
        again = await complete(http, url, PROMPT)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the engine kept it too


async def test_flush_in_dev_mode_empties_engine_and_mirror() -> None:
    engine = FakeVllm(dev_mode=True)
    async with vllm_sidecar(engine) as (url, car), aiohttp.ClientSession() as http:
        await complete(http, url, PROMPT)
        async with http.post(f"{url}/flush_cache") as resp:
            assert resp.status == 200, await resp.text()
        assert engine.hits["POST /reset_prefix_cache"] == 1
        assert car.s.mirror.tree.cached_tokens == 0
        again = await complete(http, url, PROMPT)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_prewarm_replays_the_kept_request_as_a_vllm_completion() -> None:
    holder_engine, cold_engine = FakeVllm(), FakeVllm()
    async with (
        vllm_sidecar(holder_engine) as (holder, holder_car),
        # a port of its own: the warm request prefills through it
        vllm_sidecar(cold_engine, port=free_port()) as (cold, cold_car),
        aiohttp.ClientSession() as http,
    ):
        await complete(http, holder, PROMPT)
        ids = list(tokenize(PROMPT))
        seed = CacheIdentity(SERVED, "", "").seed()
        last = block_hashes(tokenize(PROMPT), seed, BLOCK)[-1]
        warm = {"source": holder, "hashes": [f"{last:016x}"], "hold_traffic": False}
        async with http.post(f"{cold}/prefixfleet/warm", json=warm) as resp:
            assert resp.status == 200, await resp.text()
            result = await resp.json()
        assert result["results"][f"{last:016x}"]["status"] == "ok", result
        warmed = len(ids) // BLOCK * BLOCK
        # the client's request (its text: the engine tokenizes it), not the mirror's ids
        assert cold_engine.completions == [{"model": SERVED, "prompt": PROMPT, "max_tokens": 1}]
        assert cold_car.s.mirror.tree.cached_tokens >= warmed  # through the sidecar's own route
        after = await complete(http, cold, PROMPT)
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert holder_car.s.engine.api == cold_car.s.engine.api == VLLM


def test_engine_api_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    base = ["router", "sidecar", "--engine", "http://127.0.0.1:1", "--port", "1"]
    defaults = parser.parse_args(base)
    assert (defaults.engine_api, defaults.block_tokens) == ("auto", None)  # None: the engine's, else 16
    assert parser.parse_args([*base, "--engine-api", "vllm"]).engine_api == VLLM
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([*base, "--engine-api", "trtllm"])
    assert exited.value.code == 2
    assert "--engine-api: invalid choice: 'trtllm'" in capsys.readouterr().err


@contextlib.asynccontextmanager
async def serving_on(app: web.Application, port: int) -> AsyncIterator[None]:
    """``app`` on a given loopback port (an engine restarted in place keeps its address)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


def fake_sglang() -> web.Application:
    async def server_info(_request: web.Request) -> web.Response:
        return web.json_response({"served_model_name": "sg-model", "max_total_num_tokens": 5000})

    async def ok(_request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/get_model_info", ok)
    app.router.add_get("/health", ok)
    return app


async def test_the_api_is_detected_again_after_the_engine_restarts() -> None:
    port = free_port()
    config = standalone_sidecar(f"http://127.0.0.1:{port}", model=None, revision=None, cache_tokens=None)
    async with sidecar_module.listening(config) as served:
        car = served.sidecar
        async with serving_on(FakeVllm().app(), port):
            await eventually(lambda: car.s.engine.api, 20, "the vLLM engine to be detected")
            assert (car.s.engine.api, car.s.mirror.block_tokens) == (VLLM, BLOCK)
        # the engine's process is gone (refused), then an SGLang server answers at its address
        await eventually(lambda: car.s.engine_was_down, 20, "the sidecar to see the engine refuse")
        async with serving_on(fake_sglang(), port):
            await eventually(lambda: car.s.engine.api == SGLANG, 20, "the restarted engine to be re-detected")
            assert (car.s.engine.model, car.s.mirror.block_tokens) == ("sg-model", 16)
            assert car.load_report().capacity_tokens == 5000
