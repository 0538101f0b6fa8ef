"""Requests the engine refuses teach the sidecar's load tracker nothing about its prefill speed.

The tracker learns the engine's prefill rate and fixed latency from the time to first byte of
requests it prefilled. An error answer (a prompt past the context length, an unknown model: a 4xx
that comes at once, before any prefill) was finished as a success, so its whole prompt counted as
prefilled in the milliseconds the refusal took: 40 refused streamed prompts took a configured
5000 tok/s to over 2 million. Gateways estimate each replica's wait from that rate, so the replica
refusing requests looked free and was sent everything. Such requests now finish as failed (the
``failed`` outcome of ``prefixfleet_sidecar_tracked_requests_total``) and are no samples.

Real HTTP on 127.0.0.1: a stand-in engine refusing every ``/generate`` with a 400 (answered whole,
as SGLang answers a streamed request it refuses) or a 200 stream whose first event is an error,
the real sidecar (``listening``).
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)
REQUESTS = 40
RATE = 5000.0


async def refusing_engine(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("text", "").startswith("event"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"error": {"message": "context length exceeded"}}\n\n')
        await response.write_eof()
        return response
    return web.json_response({"error": {"message": "context length exceeded"}}, status=400)


@pytest.mark.parametrize("refusal", ["status", "event"])
async def test_refused_requests_leave_the_measured_rate_alone(refusal: str) -> None:
    async with (
        serve_aiohttp(stand_in_engine({"/generate": refusing_engine})) as engine,
        listening(standalone_sidecar(engine, prefill_tokens_per_s=RATE)) as served,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://{LOOPBACK}:{served.port}/generate"
        for i in range(REQUESTS):
            words = 100 + (i % 8) * 300  # sizes that spread, as the latency line wants
            prompt = f"{refusal} " + " ".join(f"r{i}w{j}" for j in range(words))
            async with http.post(url, json={"text": prompt, "stream": True}) as resp:
                await resp.read()
                assert resp.status == (400 if refusal == "status" else 200)
        load = served.sidecar.s.load
        assert (load.samples, load.latency_samples) == (0, 0)
        assert (load.prefill_tokens_per_s, load.fixed_latency_s) == (RATE, 0.0)
        assert (load.completed, load.failed, load.in_flight) == (0, REQUESTS, 0)
