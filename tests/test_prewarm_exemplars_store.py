"""The requests a sidecar keeps for pre-warming (router/exemplars.py) and how a warm replays them.

Specification:
* the store holds at most its byte bound, evicting the least recently used exemplar first (a
  lookup counts as a use); one exemplar per prompt and salt, the newest; a request larger than the
  whole store, or any request with a bound of 0, is not kept;
* a lookup finds the newest exemplar under the prefix's salt whose prompt starts with the prefix;
* ``prefill_request`` keeps the client's prompt fields and ``cache_salt`` and makes the replay
  prefill-only: SGLang ``/generate`` with ``max_new_tokens: 0``; OpenAI routes with ``max_tokens: 1``
  and nothing streamed, sampled twice or log-probed; a ``/generate`` exemplar on a vLLM engine
  becomes a completion of the same text or ids; a malformed exemplar is a ValueError naming it;
* the sidecar keeps a single prompt the engine accepted, its body as received and no header (no
  ``Authorization``); not a request the engine refused, nor a batch.
"""

from __future__ import annotations

from dataclasses import fields

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.exemplars import EXEMPLAR_OVERHEAD_BYTES, ExemplarStore
from prefixfleet.router.prewarm import prefill_request
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.sidecar import listening
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)


def toks(*ids: int) -> bytes:
    return as_token_bytes(list(ids))


def body_of(size: int) -> bytes:
    return b"{" + b" " * (size - 2) + b"}"


def test_the_store_keeps_its_byte_bound_and_evicts_the_least_recently_used() -> None:
    each = 1000 + 4 * 4 + len("/generate") + EXEMPLAR_OVERHEAD_BYTES  # body, 4 tokens, path, overhead
    store = ExemplarStore(3 * each)
    for first in (1, 2, 3):
        assert store.record("/generate", body_of(1000), None, toks(first, 0, 0, 0))
    assert len(store) == 3 and store.bytes == 3 * each
    # a lookup uses the oldest: the next eviction takes the second instead
    assert store.holding(toks(1, 0), None) is not None
    assert store.record("/generate", body_of(1000), None, toks(4, 0, 0, 0))
    assert len(store) == 3 and store.bytes == 3 * each
    assert store.holding(toks(2), None) is None
    assert all(store.holding(toks(first), None) is not None for first in (1, 3, 4))


def test_one_exemplar_per_prompt_the_newest_and_oversized_or_disabled_keeps_nothing() -> None:
    store = ExemplarStore(10_000)
    store.record("/generate", b'{"text": "a b", "rid": "1"}', "t", toks(1, 2))
    store.record("/generate", b'{"text": "a b", "rid": "2"}', "t", toks(1, 2))
    assert len(store) == 1 and store.holding(toks(1), "t").body.endswith(b'"2"}')
    assert store.bytes == store.holding(toks(1), "t").size
    store.record("/generate", b'{"text": "a b"}', None, toks(1, 2))  # another salt: another prompt
    assert len(store) == 2
    assert not store.record("/generate", body_of(20_000), None, toks(9))  # larger than the store
    assert len(store) == 2
    off = ExemplarStore(0)
    assert not off.record("/generate", b"{}", None, toks(1)) and len(off) == 0
    with pytest.raises(ValueError, match="max_bytes"):
        ExemplarStore(-1)


def test_a_lookup_takes_the_newest_prompt_holding_the_prefix_under_its_salt() -> None:
    store = ExemplarStore(10_000)
    store.record("/generate", b'{"n": 1}', "a", toks(1, 2, 3))
    store.record("/generate", b'{"n": 2}', "a", toks(1, 2, 4))
    store.record("/generate", b'{"n": 3}', "b", toks(1, 2, 5))
    store.record("/generate", b'{"n": 4}', "a", toks(7, 1, 2))  # holds 1 2, but not as its prefix
    assert store.holding(toks(1, 2), "a").body == b'{"n": 2}'
    assert store.holding(toks(1, 2, 3), "a").body == b'{"n": 1}'
    assert store.holding(toks(1, 2), "b").body == b'{"n": 3}'
    assert store.holding(toks(1, 2), None) is None  # no unsalted prompt
    assert store.holding(toks(1, 2, 3, 4), "a") is None  # longer than every prompt
    assert store.holding(b"", "a") is None


def test_a_generate_replay_is_prefill_only_and_keeps_the_prompt_and_salt() -> None:
    sent = {
        "text": "hello world",
        "sampling_params": {"max_new_tokens": 50, "temperature": 0.5, "n": 2, "min_new_tokens": 3},
        "stream": True,
        "rid": "req-1",
        "return_logprob": True,
        "cache_salt": "tenant-a",
    }
    path, body = prefill_request("sglang", {"path": "/generate", "body": sent}, "")
    assert path == "/generate"
    assert body == {
        "text": "hello world",
        "sampling_params": {"temperature": 0.5, "max_new_tokens": 0},
        "cache_salt": "tenant-a",
    }
    assert sent["stream"] is True  # the exemplar itself is left alone
    # a vLLM engine has no /generate: the same prompt (text, or the client's ids) as a completion
    path, body = prefill_request("vllm", {"path": "/generate", "body": sent}, "served")
    assert (path, body) == (
        "/v1/completions",
        {"prompt": "hello world", "max_tokens": 1, "cache_salt": "tenant-a", "model": "served"},
    )
    ids = {"input_ids": [5, 6, 7]}
    assert prefill_request("vllm", {"path": "/generate", "body": ids}, "")[1] == {
        "prompt": [5, 6, 7],
        "max_tokens": 1,
    }


def test_an_openai_replay_asks_for_one_token_once_and_keeps_what_shapes_the_prompt() -> None:
    tools = [{"type": "function", "function": {"name": "book", "parameters": {"type": "object"}}}]
    sent = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "max_completion_tokens": 400,
        "min_tokens": 10,
        "cache_salt": "tenant-b",
    }
    for api in ("sglang", "vllm"):
        path, body = prefill_request(api, {"path": "/v1/chat/completions", "body": sent}, "other")
        assert path == "/v1/chat/completions"
        assert body == {"model": "m", "messages": sent["messages"], "tools": tools, "cache_salt": "tenant-b",
                        "max_tokens": 1}  # fmt: skip
    completion = {"prompt": [1, 2], "max_tokens": 99, "echo": True, "logprobs": 5, "best_of": 2}
    assert prefill_request("vllm", {"path": "/v1/completions", "body": completion}, "")[1] == {
        "prompt": [1, 2],
        "max_tokens": 1,
    }


@pytest.mark.parametrize(
    ("exemplar", "why"),
    [
        ([], "not a JSON object"),
        ({"path": "/admin", "body": {}}, "no generation route"),
        ({"path": "/generate", "body": "text"}, "no JSON object body"),
        ({"path": "/generate", "body": {"text": ["a", "b"], "sampling_params": [{}, {}]}}, "sampling_params"),
    ],
)
def test_a_malformed_exemplar_is_refused_naming_what_is_wrong(exemplar: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        prefill_request("sglang", exemplar, "")


async def test_the_sidecar_keeps_accepted_single_prompts_without_their_headers() -> None:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("text") == "refused prompt":
            return web.json_response({"error": {"message": "no"}}, status=400)
        return web.json_response({"text": "x", "meta_info": {"cached_tokens": 0, "prompt_tokens": 2}})

    async with (
        serve_aiohttp(stand_in_engine({"/generate": generate})) as engine,
        listening(standalone_sidecar(engine)) as served,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://{LOOPBACK}:{served.port}/generate"
        headers = {
            "Authorization": "Bearer sk-secret",
            "X-Api-Key": "k-secret",
            "Content-Type": "application/json",
        }
        kept = b'{"text": "kept prompt", "cache_salt": "t"}'
        for body in (kept, b'{"text": "refused prompt"}', b'{"text": ["a batch", "of two"]}'):
            async with http.post(url, data=body, headers=headers) as resp:
                await resp.read()
        store = served.sidecar.s.exemplars
        assert len(store) == 1  # neither the refused request nor the batch
        exemplar = store.holding(as_token_bytes(tokenize("kept prompt")), "t")
        assert exemplar is not None and exemplar.path == "/generate" and exemplar.body == kept
        # what an exemplar is made of: no header among it, so no credential
        assert [f.name for f in fields(exemplar)] == ["path", "body", "salt", "token_bytes"]
        assert all(b"secret" not in repr(getattr(exemplar, f.name)).encode() for f in fields(exemplar))
