"""A streamed answer that carries no generated text ends properly at the client.

The sidecar collects a stream's text to mirror the output after it. A complete 200 stream with no
text in it (the engine's error event alone, nothing generated: a prefill-only request, an answer
of only a role and usage) made that step fail (``after_echo`` of no text: AttributeError) after
the last event was passed on: the handler died before ending the chunked body, so the client read
a truncated answer (aiohttp: "Response payload is not completed") and the sidecar logged an
error. Now such a stream ends as the engine ended it.

Real HTTP on 127.0.0.1: a stand-in engine streaming the given events, the real sidecar
(``listening``), an aiohttp client.
"""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, eventually, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)
PROMPT = " ".join(f"word{i}" for i in range(40))

STREAMS = {
    "error event": ("/generate", [{"error": {"message": "context length exceeded"}}]),
    "empty text": ("/generate", [{"text": "", "meta_info": {"prompt_tokens": 40}}]),
    "role only": (
        "/v1/chat/completions",
        [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, {"choices": [], "usage": {}}],
    ),
}


def streaming_engine(events: list[dict]) -> web.Application:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events))
        await response.write_eof(b"data: [DONE]\n\n")
        return response

    return stand_in_engine(dict.fromkeys(("/generate", "/v1/chat/completions"), answer))


@pytest.mark.parametrize("name", list(STREAMS))
async def test_a_stream_without_text_reaches_the_client_whole(name: str) -> None:
    path, events = STREAMS[name]
    body: dict = {"stream": True}
    if path == "/generate":
        body["text"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    async with (
        serve_aiohttp(streaming_engine(events)) as engine,
        listening(standalone_sidecar(engine)) as served,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(f"http://{LOOPBACK}:{served.port}{path}", json=body) as resp:
            data = await resp.read()  # raises ClientPayloadError when the chunked body is cut
            assert resp.status == 200
            assert data.endswith(b"data: [DONE]\n\n")
        await eventually(lambda: served.sidecar.s.load.in_flight == 0, 30, "the request to finish")
