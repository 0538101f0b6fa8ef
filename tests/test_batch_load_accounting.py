"""A batch of prompts is counted as the prefill of all its prompts while the engine works on it.

Specification:
* a batch is routed by its first prompt (matched against the cache under that prompt's salt), but
  the engine prefills every prompt: its predicted prefill is the first prompt's uncached tokens plus
  every other prompt's tokens (counted as uncached);
* so while a batch of 3 prompts is in flight, the gateway's view of the worker (its unreported
  sends) and the sidecar's load tracker (its pending prefill tokens, which it reports to the
  gateways) both count the tokens of all 3 prompts, not the first's alone.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.router.gateway import GatewayConfig
from prefixfleet.router.gateway import listening as gateway_listening
from prefixfleet.router.requests import parse_inference_request
from prefixfleet.router.sidecar import SidecarConfig
from prefixfleet.router.sidecar import listening as sidecar_listening
from prefixfleet.tokenizer import count_tokens

pytestmark = pytest.mark.timeout(60)

PROMPTS = [" ".join(f"{name}{i}" for i in range(size)) for name, size in (("a", 40), ("b", 30), ("c", 20))]
ALL_TOKENS = sum(count_tokens(p) for p in PROMPTS)  # 90


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": PROMPTS, "cache_salt": ["A", "B", "C"]}),
        ("/generate", {"input_ids": [list(range(40)), list(range(30)), list(range(20))]}),
        ("/v1/completions", {"prompt": PROMPTS}),
        ("/v1/completions", {"prompt": [list(range(40)), list(range(30)), list(range(20))]}),
    ],
    ids=["generate-text", "generate-ids", "completions-text", "completions-ids"],
)
def test_a_batchs_predicted_prefill_is_every_prompts_tokens_less_the_first_prompts_match(
    path: str, body: dict[str, object]
) -> None:
    parsed = parse_inference_request(path, json.dumps(body).encode())
    assert (parsed.prompts, parsed.num_tokens) == (3, 40)  # routed by its first prompt
    assert parsed.uncached_tokens(0) == ALL_TOKENS
    assert parsed.uncached_tokens(40) == ALL_TOKENS - 40  # only the first prompt is matched


def test_a_single_prompts_predicted_prefill_is_its_uncached_part() -> None:
    parsed = parse_inference_request("/generate", json.dumps({"text": PROMPTS[0]}).encode())
    assert (parsed.prompts, parsed.uncached_tokens(0), parsed.uncached_tokens(15)) == (1, 40, 25)


async def test_a_batch_in_flight_counts_all_its_prompts_at_the_gateway_and_the_sidecar() -> None:
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def held_generate(request: web.Request) -> web.StreamResponse:
        # A stand-in engine that holds the answer until the test has looked at both hops' load.
        await request.read()
        arrived.set()
        await release.wait()
        return web.json_response([{"text": "x", "meta_info": {}} for _ in PROMPTS])

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/generate", held_generate)
    app.router.add_get("/health", health)
    async with serve_aiohttp(app) as engine_url:
        sidecar_config = SidecarConfig(
            engine_url=engine_url, redis_url=None, port=0, worker_id="w0", model="m", revision="r"
        )
        async with sidecar_listening(sidecar_config) as sidecar:
            sidecar_url = f"http://127.0.0.1:{sidecar.port}"
            gateway_config = GatewayConfig(port=0, workers=(sidecar_url,))
            async with gateway_listening(gateway_config) as gateway, aiohttp.ClientSession() as http:
                # one new token: the tracker counts the whole prefill as pending until the answer
                body = {"text": PROMPTS, "sampling_params": {"max_new_tokens": 1}}
                url = f"http://127.0.0.1:{gateway.port}/generate"
                answer = asyncio.create_task(http.post(url, json=body))
                try:
                    await asyncio.wait_for(arrived.wait(), 10)
                    load = sidecar.sidecar.s.load
                    for _ in range(200):  # the sidecar tracks the request just after sending it on
                        if load.in_flight:
                            break
                        await asyncio.sleep(0.01)
                    sends = gateway.gateway.view.workers[sidecar_url].sends
                    assert [s.uncached_tokens for s in sends.values()] == [ALL_TOKENS]
                    assert load.in_flight == 1
                    assert load.pending_prefill_tokens(time.monotonic()) == ALL_TOKENS
                finally:
                    release.set()
                    async with await answer as resp:
                        assert resp.status == 200, await resp.text()
