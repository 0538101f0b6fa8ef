"""A sidecar in front of an engine whose prefix cache is off predicts no hits and publishes nothing.

vLLM run with ``--no-enable-prefix-caching`` (or a model it turns prefix caching off for) still
exports ``vllm:cache_config_info``, with the label ``enable_prefix_caching="False"``
(vllm/config/cache.py: ``metrics_info()`` is ``str()`` of every CacheConfig field); SGLang run with
``--disable-radix-cache`` says ``"disable_radix_cache": true`` in ``/get_server_info`` (its server
args). Such an engine never reports a cached token: a sidecar that mirrored its prompts anyway
published them in its summary, and gateways sent every repeat of a prefix to a replica that would
recompute it, piling one prefix's traffic onto one replica for no hit at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, serve_aiohttp, standalone_sidecar

from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.engine_api import vllm_cache_config
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

SERVED = "served-model"
PROMPT = "a long shared system prompt that every request of this tenant starts with " * 6


def cache_config_text(**labels: object) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{shown}}} 1.0\n"


def usage(prompt_tokens: int) -> dict[str, Any]:
    # the engine caches nothing: every answer reports 0 cached tokens
    details = {"cached_tokens": 0}
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1} | {
        "prompt_tokens_details": details
    }


async def complete(request: web.Request) -> web.Response:
    body = await request.json()
    n = len(tokenize(body["prompt"]))
    choice = {"index": 0, "text": " ok", "finish_reason": "length"}
    return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage(n)})


def engine_app(gets: dict[str, Any]) -> web.Application:
    """An engine answering ``gets`` and POST /v1/completions."""
    app = web.Application()
    for path, handler in gets.items():
        app.router.add_get(path, handler)
    app.router.add_post("/v1/completions", complete)
    return app


def fake_vllm(caching: str) -> web.Application:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": SERVED, "object": "model"}]})

    async def metrics(_request: web.Request) -> web.Response:
        labels = {"block_size": 16, "enable_prefix_caching": caching, "engine": 0, "num_gpu_blocks": 1000}
        return web.Response(text=cache_config_text(**labels), content_type="text/plain")

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    return engine_app({"/health": health, "/v1/models": models, "/metrics": metrics})


def fake_sglang(disable_radix_cache: bool) -> web.Application:
    async def server_info(_request: web.Request) -> web.Response:
        info = {"served_model_name": "m", "max_total_num_tokens": 50_000, "enable_cache_report": True}
        return web.json_response(info | {"disable_radix_cache": disable_radix_cache})

    async def empty(_request: web.Request) -> web.Response:
        return web.json_response({})

    return engine_app({"/get_server_info": server_info, "/get_model_info": empty, "/health": empty})


@contextlib.asynccontextmanager
async def sidecar_before(app: web.Application) -> AsyncIterator[tuple[str, sidecar_module.Sidecar]]:
    async with serve_aiohttp(app) as engine_url:
        config = standalone_sidecar(engine_url, model=None, revision=None, cache_tokens=None)
        async with sidecar_module.listening(config) as served:
            car = served.sidecar
            await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
            yield f"http://127.0.0.1:{served.port}", car


async def send_twice(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 1}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()


def test_cache_config_states_whether_prefix_caching_is_on() -> None:
    on = vllm_cache_config(cache_config_text(block_size=16, enable_prefix_caching="True", num_gpu_blocks=10))
    off = vllm_cache_config(
        cache_config_text(block_size=16, enable_prefix_caching="False", num_gpu_blocks=10)
    )
    unsaid = vllm_cache_config(cache_config_text(block_size=16, num_gpu_blocks=10))
    assert (on.prefix_caching, off.prefix_caching, unsaid.prefix_caching) == (True, False, True)
    assert off.capacity_tokens == 160  # the rest is read as before


@pytest.mark.parametrize(
    "engine", [lambda: fake_vllm("False"), lambda: fake_sglang(True)], ids=["vllm", "sglang"]
)
async def test_no_prefix_cache_no_predicted_hits_nothing_published(engine: Any) -> None:
    async with sidecar_before(engine()) as (url, car):
        await send_twice(url)
        mirror = car.s.mirror
        assert mirror.compared_requests == 2  # the engine's reports were read...
        assert mirror.predicted_tokens_total == 0  # ...and no hit was predicted for the repeat
        assert mirror.tree.cached_tokens == 0  # nothing for gateways to route by
        assert car.load_report().cached_tokens == 0
        summary = mirror.summary(worker="w0", version=1)
        assert len(summary.blocks) == 0


@pytest.mark.parametrize(
    "engine", [lambda: fake_vllm("True"), lambda: fake_sglang(False)], ids=["vllm", "sglang"]
)
async def test_with_prefix_caching_the_mirror_holds_the_prompt(engine: Any) -> None:
    # the same engines with their cache on: the prompt is mirrored and predicted, as before
    async with sidecar_before(engine()) as (url, car):
        await send_twice(url)
        assert car.s.mirror.predicted_tokens_total > 0
