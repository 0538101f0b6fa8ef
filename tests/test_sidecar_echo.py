"""A completion asked with ``echo``: the sidecar's mirror learns the output, never the prompt twice.

Specification:
* SGLang's /v1/completions with ``echo: true`` starts each choice's text with its prompt (the
  emulator refuses echo); the engine caches the prompt and the output once, so the mirror holds the
  prompt followed by the text after the echoed prompt, answered whole or streamed (the first delta
  carries the prompt);
* when the text does not start with the prompt as sent (a prompt of token ids, which the engine's
  tokenizer decodes; an engine echoing it otherwise), the mirror learns no output from that answer:
  it holds the prompt alone, admitted when the request was sent.

Real HTTP on 127.0.0.1: a stand-in engine answering /v1/completions as SGLang does with echo, the
real sidecar (``listening``), an aiohttp client.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.sidecar import SidecarConfig, listening
from prefixfleet.tokenizer import text_for_tokens, tokenize

pytestmark = pytest.mark.timeout(60)

PROMPT = " ".join(f"word{i}" for i in range(20))
OUTPUT = [" out0 out1", " out2"]  # the generated text, in the pieces a stream sends


def sglang_echo_engine(echo_of: Callable[[object], str]) -> web.Application:
    """/v1/completions answered as SGLang does for one prompt with ``echo``: the echoed prompt
    (``echo_of(prompt)``) before the output, in the whole text or the first streamed delta."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["echo"] is True
        echo = echo_of(body["prompt"])
        prompt_tokens = len(tokenize(echo))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 3,
            "total_tokens": prompt_tokens + 3,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        if not body.get("stream"):
            choice = {"index": 0, "text": echo + "".join(OUTPUT), "finish_reason": "length"}
            return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        deltas = [echo + OUTPUT[0], *OUTPUT[1:]]
        for delta in deltas:
            event = {"object": "text_completion", "choices": [{"index": 0, "text": delta}]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    return app


async def mirrored_after(prompt: object, echo_of: Callable[[object], str], stream: bool) -> tuple[int, int]:
    """(tokens the sidecar's mirror holds, of which a prefix of prompt + output) after one echoed
    completion through it."""
    async with serve_aiohttp(sglang_echo_engine(echo_of)) as engine_url:
        config = SidecarConfig(
            engine_url=engine_url,
            redis_url=None,
            port=0,
            worker_id="w0",
            model="m",
            revision="r",
            cache_tokens=200_000,
        )
        async with listening(config) as served, aiohttp.ClientSession() as http:
            body = {"prompt": prompt, "echo": True, "max_tokens": 3, "stream": stream}
            async with http.post(f"http://127.0.0.1:{served.port}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            tree = served.sidecar.s.mirror.tree
            prompt_ids = list(prompt) if isinstance(prompt, list) else list(tokenize(PROMPT))
            learned = as_token_bytes([*prompt_ids, *tokenize("".join(OUTPUT))])
            return tree.cached_tokens, tree.matched_tokens(learned, None)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_echoed_prompt_is_mirrored_once_with_the_output_after_it(stream: bool) -> None:
    held, matched = await mirrored_after(PROMPT, lambda prompt: str(prompt), stream)
    output_tokens = len(tokenize("".join(OUTPUT)))
    assert held == matched == len(tokenize(PROMPT)) + output_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("prompt", "echo_of"),
    [
        # the engine's tokenizer decodes token ids: not text the sidecar can know
        (list(range(1, 21)), lambda ids: text_for_tokens(ids)),
        # an engine echoing the prompt otherwise than sent (here: without its spacing)
        (PROMPT, lambda prompt: str(prompt).replace(" ", "  ")),
    ],
    ids=["token-ids", "respaced"],
)
async def test_an_echo_not_matching_the_prompt_teaches_the_mirror_no_output(
    prompt: object, echo_of: Callable[[object], str], stream: bool
) -> None:
    held, _ = await mirrored_after(prompt, echo_of, stream)
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(tokenize(PROMPT))
    assert held == prompt_tokens
