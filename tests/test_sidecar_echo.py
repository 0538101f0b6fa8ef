"""A completion asked with ``echo``: the sidecar's mirror learns the output, never the prompt twice.

Specification:
* SGLang's /v1/completions with ``echo: true`` starts each choice's text with its prompt (the
  emulator refuses echo); the engine caches the prompt and the output once, so the mirror holds the
  prompt followed by the text after the echoed prompt, answered whole or streamed (the first delta
  carries the prompt);
* ``echo`` is found however the body spells it as JSON the engine reads: the key with ``\\u``
  escapes (``"\\u0065cho"``), the body in UTF-16 (json.loads, like SGLang's parser, reads it), while
  a body that cannot ask it (no such key, only other ``\\u`` escapes) is not parsed a second time;
* when the text does not start with the prompt as sent (a prompt of token ids, which the engine's
  tokenizer decodes; an engine echoing it otherwise), the mirror learns no output from that answer:
  it holds the prompt alone, admitted when the request was sent.

Real HTTP on 127.0.0.1: a stand-in engine answering /v1/completions as SGLang does with echo, the
real sidecar (``listening``), an aiohttp client.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp, standalone_sidecar

from prefixfleet.router.proxying import echoed_prompt, may_ask_echo
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.sidecar import listening
from prefixfleet.tokenizer import text_for_tokens, tokenize

pytestmark = pytest.mark.timeout(60)

PROMPT = " ".join(f"word{i}" for i in range(20))
OUTPUT = [" out0 out1", " out2"]  # the generated text, in the pieces a stream sends


def sglang_echo_engine(echo_of: Callable[[object], str]) -> web.Application:
    """/v1/completions answered as SGLang does for one prompt with ``echo``: the echoed prompt
    (``echo_of(prompt)``) before the output, in the whole text or the first streamed delta."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())  # as SGLang's parser reads it: UTF-16 and \u escapes too
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


def as_json(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


async def mirrored_after(
    prompt: object,
    echo_of: Callable[[object], str],
    stream: bool,
    encoded: Callable[[dict[str, object]], bytes] = as_json,
) -> tuple[int, int]:
    """(tokens the sidecar's mirror holds, of which a prefix of prompt + output) after one echoed
    completion through it, its JSON body written by ``encoded``."""
    async with serve_aiohttp(sglang_echo_engine(echo_of)) as engine_url:
        config = standalone_sidecar(engine_url)
        async with listening(config) as served, aiohttp.ClientSession() as http:
            body = {"prompt": prompt, "echo": True, "max_tokens": 3, "stream": stream}
            url, headers = (
                f"http://127.0.0.1:{served.port}/v1/completions",
                {"Content-Type": "application/json"},
            )
            async with http.post(url, data=encoded(body), headers=headers) as resp:
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


def with_escaped_echo_key(body: dict[str, object]) -> bytes:
    """The body with its key ``echo`` written ``"\\u0065cho"`` (json.loads reads "echo")."""
    text = json.dumps(body)
    assert text.count('"echo"') == 1
    return text.replace('"echo"', '"\\u0065cho"').encode()


def in_utf16(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode("utf-16")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("encoded", [with_escaped_echo_key, in_utf16], ids=["escaped-key", "utf-16"])
async def test_echo_asked_in_any_json_spelling_is_mirrored_once(
    stream: bool, encoded: Callable[[dict[str, object]], bytes]
) -> None:
    held, matched = await mirrored_after(PROMPT, lambda prompt: str(prompt), stream, encoded)
    assert held == matched == len(tokenize(PROMPT)) + len(tokenize("".join(OUTPUT)))


def echo_key_spellings() -> list[str]:
    """Every way JSON may write the key ``echo``: each letter itself or \\uXXXX, hex in either case."""
    forms = [(c, f"\\u{ord(c):04x}", f"\\u{ord(c):04X}") for c in "echo"]
    return sorted({"".join(letters) for letters in itertools.product(*forms)})


def test_the_echo_pre_check_misses_no_spelling_of_the_key_and_passes_bodies_without_it() -> None:
    spellings = echo_key_spellings()
    assert len(spellings) == 2 * 2 * 2 * 3  # e, c, h have only digits in their escapes; o: 006f/006F
    for key in spellings:
        raw = f'{{"prompt": "p", "max_tokens": 3, "{key}": true}}'
        assert json.loads(raw)["echo"] is True
        assert may_ask_echo(raw.encode()), raw
        assert echoed_prompt("/v1/completions", raw.encode()) == "p", raw
    for encoding in ("utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32"):
        raw = json.dumps({"prompt": "p", "echo": True})
        assert echoed_prompt("/v1/completions", raw.encode(encoding)) == "p", encoding
    # what the hot path skips: no key echo, whatever else is escaped (an ASCII-only client's prompt)
    for raw in (
        json.dumps({"prompt": "héllo wörld, say echo", "max_tokens": 3}).encode(),  # \u00e9 escapes
        json.dumps({"prompt": 'quoting "echo" in a prompt', "echoes": True}).encode(),
        rb'{"prompt": "p", "\u0065chos": true, "n": 1}',
    ):
        assert not may_ask_echo(raw), raw
        assert echoed_prompt("/v1/completions", raw) == ""
