"""docs/metrics.md says which generation requests the sidecar counts ``ok`` and which ``failed``,
and the sidecar counts them so.

``prefixfleet_sidecar_tracked_requests_total{outcome}``: ``ok`` only when the engine prefilled the
request (a whole 200 answer, or a 200 stream whose first event is no error event); an engine's
refusal before the first token (a 4xx or 5xx, or a stream opening with an error event) is
``failed``, and only ``ok`` requests are prefill-rate samples. The row used to say only "generation
requests finished", which read as: every request the engine answered is ``ok``.

Real HTTP on 127.0.0.1: a stand-in engine answering each kind of request, the real sidecar, its
``GET /metrics``.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp, standalone_sidecar
from prometheus_client.parser import text_string_to_metric_families
from stand_in_engine import stand_in_engine

from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)
DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
NAME = "prefixfleet_sidecar_tracked_requests_total"


async def _stream(request: web.Request, event: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(event + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def engine_answer(request: web.Request) -> web.StreamResponse:
    kind = (await request.json())["text"].split()[0]
    if kind == "whole":
        return web.json_response({"text": " fine", "meta_info": {"cached_tokens": 0}})
    if kind == "streamed":
        return await _stream(request, b'data: {"text": " fine", "meta_info": {"cached_tokens": 0}}\n\n')
    if kind == "error_event":
        return await _stream(request, b'data: {"error": {"message": "context length exceeded"}}\n\n')
    status = int(kind.removeprefix("status"))
    return web.json_response({"error": {"message": "refused"}}, status=status)


# what each request's first word has the engine answer, and the outcome the docs promise
CASES = {
    "whole": "ok",
    "streamed": "ok",
    "status400": "failed",
    "status500": "failed",
    "error_event": "failed",
}


def test_the_docs_row_says_engine_refusals_count_as_failed() -> None:
    (row,) = re.findall(rf"^\| `{NAME}` \|.*$", DOC.read_text(), re.MULTILINE)
    meaning = row.split("|")[4]
    ok, failed = meaning.split("`failed`")
    assert "`ok`" in ok and "prefilled" in ok
    assert "refusal" in failed and "4xx or 5xx" in failed and "error event" in failed


async def test_the_sidecar_counts_the_outcomes_the_docs_row_names() -> None:
    async with (
        serve_aiohttp(stand_in_engine({"/generate": engine_answer})) as engine,
        listening(standalone_sidecar(engine)) as served,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://{LOOPBACK}:{served.port}"
        for kind in CASES:
            body = {"text": f"{kind} please answer", "stream": kind in ("streamed", "error_event")}
            async with http.post(f"{url}/generate", json=body) as resp:
                await resp.read()
        async with http.get(f"{url}/metrics") as resp:
            exposition = await resp.text()
    counted = {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == NAME
    }
    expected = list(CASES.values())
    assert counted == {"ok": expected.count("ok"), "failed": expected.count("failed")}
