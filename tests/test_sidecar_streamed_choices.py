"""A streamed answer with several choices (``n`` > 1) is mirrored by its first choice only.

SGLang samples each of a request's ``n`` choices as its own sequence and keeps each one's prompt +
output in its radix cache. A stream interleaves the choices' events, each naming its choice by
``index`` (completions and chat: per choice; native /generate: per event, its text cumulative for
that choice). The sidecar's mirror used to join every event's text into one output: a branch of
mixed-up words no choice produced, which the engine never caches, taking the mirror's capacity
and the published summary's. Now only choice 0 is collected (as a whole answer is mirrored by
its first choice): a real branch of the engine's cache.

Real HTTP on 127.0.0.1: a stand-in engine streaming two interleaved choices in SGLang's shape,
the real sidecar in front of it.
"""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.proxying import StreamedText
from prefixfleet.router.sidecar import listening
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

PROMPT = " ".join(f"word{i}" for i in range(24))
# each choice's output, in the pieces its events carry; the two choices' pieces interleave
CHOICES = ([" alpha", " bravo", " charlie"], [" xray", " yankee", " zulu", " omega"])
PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


def _events(path: str) -> list[dict[str, object]]:
    """The choices' events in arrival order: 0, 1, 0, 1, ... (choice 1, longer, sends last)."""
    events: list[dict[str, object]] = []
    sent = ["", ""]
    for step in range(max(len(c) for c in CHOICES)):
        for index, pieces in enumerate(CHOICES):
            if step >= len(pieces):
                continue
            piece = pieces[step]
            sent[index] += piece
            if path == "/generate":  # SGLang's native stream: the choice's text so far, its index
                events.append({"text": sent[index], "index": index, "meta_info": {"id": f"r{index}"}})
            elif path == "/v1/completions":
                events.append({"choices": [{"index": index, "text": piece, "finish_reason": None}]})
            else:
                events.append({"choices": [{"index": index, "delta": {"content": piece}}]})
    return events


def _stream(path: str) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in _events(path)) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("path", PATHS)
def test_streamed_text_is_the_first_choices_text(path: str) -> None:
    collector = StreamedText(path)
    collector.feed(_stream(path))
    assert collector.text == "".join(CHOICES[0])


def test_streamed_text_takes_choice_0_wherever_an_event_lists_it() -> None:
    # an event may carry several choices, choice 0 not first among them
    event = {"choices": [{"index": 1, "text": " no"}, {"index": 0, "text": " yes"}]}
    collector = StreamedText("/v1/completions")
    collector.feed(b"data: " + json.dumps(event).encode() + b"\n\n")
    assert collector.text == " yes"


def _request(path: str) -> dict[str, object]:
    if path == "/generate":
        return {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "n": 2}, "stream": True}
    if path == "/v1/completions":
        return {"model": "m", "prompt": PROMPT, "max_tokens": 8, "n": 2, "stream": True}
    return {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "n": 2,
        "stream": True,
    }


@pytest.mark.parametrize("path", PATHS)
async def test_an_n2_stream_is_mirrored_as_the_prompt_and_its_first_choice(path: str) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_stream(path))
        await response.write_eof()
        return response

    async with (
        serve_aiohttp(stand_in_engine({path: answer})) as engine,
        listening(standalone_sidecar(engine)) as served,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(f"http://{LOOPBACK}:{served.port}{path}", json=_request(path)) as resp:
            assert resp.status == 200
            await resp.read()
        tree = served.sidecar.s.mirror.tree
        # one branch: the prompt as the sidecar tokenized it, then choice 0's output
        (cached,) = tree.cached_sequences(None)
        output = list(tokenize("".join(CHOICES[0])))
        assert cached[-len(output) :] == output
        assert tree.cached_tokens == len(cached)
        assert all(t not in cached for t in tokenize(" ".join(CHOICES[1])))  # nothing of choice 1
