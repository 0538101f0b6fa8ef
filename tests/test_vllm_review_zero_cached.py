"""A vLLM that leaves a 0 cached count out of its usage still corrects the sidecar's mirror.

vLLM's serving code (completion/serving.py and chat_completion/serving.py in most stored versions of
vllm-project/vllm) sets ``usage.prompt_tokens_details`` only ``if self.enable_prompt_tokens_details
and num_cached_tokens``: with the flag on, a request that found nothing cached reports no details at
all, exactly as a server without the flag. The sidecar read every such answer as "not reported", so
the one report that matters most — the engine no longer holds a prefix the mirror predicted (evicted
under memory pressure, or lost in a restart the sidecar did not see) — never corrected the mirror,
and gateways kept sending that prefix's traffic to a replica that recomputed it each time.

Once an engine has answered with ``prompt_tokens_details`` it runs with the flag, so from then on
(until the engine restarts) a usage without it is a 0, as the sidecar already reads an SGLang engine
that says ``enable_cache_report``. An engine that never reports details is left alone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, serve_aiohttp, standalone_sidecar

from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

BLOCK = 16
PROMPT = "every request of this workload opens with the same long instructions " * 8


class TruthTestVllm:
    """vLLM's usage as its serving code writes it: details only for a non-zero count (when
    ``details``), whole blocks short of the last token; ``forget()`` empties its cache."""

    def __init__(self, details: bool) -> None:
        self.details = details
        self.cached: set[tuple[int, ...]] = set()

    def forget(self) -> None:
        self.cached.clear()

    def hit(self, ids: list[int]) -> int:
        found = 0
        for end in range(BLOCK, len(ids), BLOCK):
            if tuple(ids[:end]) not in self.cached:
                break
            found = end
        self.cached.update(tuple(ids[:end]) for end in range(BLOCK, len(ids) + 1, BLOCK))
        return found

    def usage(self, ids: list[int]) -> dict[str, Any]:
        n, cached = len(ids), self.hit(ids)
        usage: dict[str, Any] = {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}
        if self.details and cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    async def stream(
        self, request: web.Request, response: web.StreamResponse, answer: dict[str, Any]
    ) -> None:
        """Write a stream's events; ``answer`` holds the request ``body``, the ``choice`` and ``usage``."""
        body, choice, usage = answer["body"], answer["choice"], answer["usage"]
        chunks: list[Any] = [{"object": "text_completion", "choices": [choice]}]
        if body.get("stream_options"):
            chunks.append({"object": "text_completion", "choices": [], "usage": usage})
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")

    def app(self) -> web.Application:
        async def complete(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            usage = self.usage(list(tokenize(body["prompt"])))
            choice = {"index": 0, "text": " ok", "finish_reason": "length"}
            if not body.get("stream"):
                return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await self.stream(request, response, {"body": body, "choice": choice, "usage": usage})
            return response

        async def models(_request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "served", "object": "model"}]})

        async def metrics(_request: web.Request) -> web.Response:
            text = f'vllm:cache_config_info{{block_size="{BLOCK}",engine="0",num_gpu_blocks="1000"}} 1.0\n'
            return web.Response(text=text, content_type="text/plain")

        async def health(_request: web.Request) -> web.Response:
            return web.Response()

        app = web.Application()
        for path, handler in {"/v1/models": models, "/metrics": metrics, "/health": health}.items():
            app.router.add_get(path, handler)
        app.router.add_post("/v1/completions", complete)
        return app


@contextlib.asynccontextmanager
async def sidecar_before(engine: TruthTestVllm) -> AsyncIterator[tuple[str, sidecar_module.Sidecar]]:
    async with serve_aiohttp(engine.app()) as engine_url:
        config = standalone_sidecar(engine_url, model=None, revision=None, cache_tokens=None)
        async with sidecar_module.listening(config) as served:
            car = served.sidecar
            await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
            yield f"http://127.0.0.1:{served.port}", car


async def send(http: aiohttp.ClientSession, url: str, stream: bool) -> None:
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 1}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_miss_after_details_were_seen_corrects_the_mirror(stream: bool) -> None:
    engine = TruthTestVllm(details=True)
    n = len(tokenize(PROMPT))
    expected = (n - 1) // BLOCK * BLOCK
    async with sidecar_before(engine) as (url, car), aiohttp.ClientSession() as http:
        await send(http, url, stream)  # nothing cached: no details (yet unknown whether it has the flag)
        await send(http, url, stream)  # a hit: details, so the flag is on
        mirror = car.s.mirror
        assert (mirror.predicted_tokens_total, mirror.reported_tokens_total) == (expected, expected)
        engine.forget()  # evicted under memory pressure: the engine holds nothing of the prompt
        await send(http, url, stream)  # predicted a hit; the usage says nothing: a 0
        assert mirror.reported_tokens_total == expected  # the engine's 0 was counted...
        assert mirror.overpredicted_tokens_total == expected  # ...against the predicted hit
        assert mirror.compared_requests == 2  # the first answer, before any details, is no report


async def test_an_engine_that_never_reports_details_leaves_the_mirror_alone() -> None:
    engine = TruthTestVllm(details=False)
    async with sidecar_before(engine) as (url, car), aiohttp.ClientSession() as http:
        for _ in range(3):
            await send(http, url, stream=False)
        mirror = car.s.mirror
        assert mirror.compared_requests == 0  # no report is no 0
        assert mirror.tree.cached_tokens >= len(tokenize(PROMPT))


class BreakingVllm(TruthTestVllm):
    """Streams with continuous usage stats (a running count without details on every chunk), then
    dies before its usage event: the answer never said how much was cached."""

    async def stream(
        self, request: web.Request, response: web.StreamResponse, answer: dict[str, Any]
    ) -> None:
        choice, usage = answer["choice"], answer["usage"]
        running = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        chunk = {"object": "text_completion", "choices": [choice], "usage": running}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        assert request.transport is not None
        request.transport.abort()


async def test_a_stream_cut_before_its_usage_event_is_no_zero_report() -> None:
    engine = BreakingVllm(details=True)
    async with sidecar_before(engine) as (url, car), aiohttp.ClientSession() as http:
        await send(http, url, stream=False)
        await send(http, url, stream=False)  # details seen: a missing count now reads as 0
        mirror = car.s.mirror
        compared, held = mirror.compared_requests, mirror.tree.cached_tokens
        body = {"prompt": PROMPT, "max_tokens": 4, "stream": True}
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            await resp.read()
        assert mirror.compared_requests == compared  # a running count is no report of cached tokens
        assert mirror.tree.cached_tokens >= held
