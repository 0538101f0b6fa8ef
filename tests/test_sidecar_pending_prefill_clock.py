"""The load record's ``pending_prefill_tokens`` counts non-streamed requests still prefilling.

A request that is neither streamed nor asks one token has no first byte that ends its prefill, so
its uncached tokens count as pending minus what the engine drained, at the measured rate, since it
arrived. The tracker stamps arrivals with the monotonic clock; the load record asked for the
pending tokens at the wall clock (``time.time()``), decades past any monotonic stamp, so every such
request read as drained long ago: gateways saw an idle replica behind a queue of non-streamed
prompts (``/metrics``, which asks at the monotonic clock, showed them).

Real HTTP on 127.0.0.1: a stand-in engine that holds ``/generate`` until the test lets it answer,
the real sidecar (``listening``) told the engine prefills 1 token a second (so nothing drains
while the test looks).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, eventually, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)
PROMPT_WORDS = 300


async def test_a_non_streamed_request_in_prefill_is_pending_in_the_load_record() -> None:
    arrived, answer = asyncio.Event(), asyncio.Event()

    async def generate(_request: web.Request) -> web.Response:
        arrived.set()
        await answer.wait()
        return web.json_response({"text": "", "meta_info": {}})

    async with (
        serve_aiohttp(stand_in_engine({"/generate": generate})) as engine,
        listening(standalone_sidecar(engine, prefill_tokens_per_s=1.0)) as served,
        aiohttp.ClientSession() as http,
    ):
        sidecar = served.sidecar
        prompt = " ".join(f"word{i}" for i in range(PROMPT_WORDS))
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 50}}  # untimed: no stream
        request = asyncio.create_task(http.post(f"http://{LOOPBACK}:{served.port}/generate", json=body))
        try:
            await asyncio.wait_for(arrived.wait(), 30)
            await eventually(lambda: sidecar.s.load.in_flight, 30, "the request tracked")
            # at 1 token a second, under a minute of waiting drains under 60 of its tokens
            assert sidecar.load_report().pending_prefill_tokens >= PROMPT_WORDS - 60
        finally:
            answer.set()
            async with await request as resp:
                assert resp.status == 200
