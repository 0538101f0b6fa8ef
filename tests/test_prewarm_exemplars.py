"""Pre-warming replays the requests that filled the holder's cache, never the sidecar's own token ids.

Real processes: engine emulators started with ``--vocab-size 1000`` (they refuse a client's token id
of 1000 or more, as a real engine refuses ids beyond its vocabulary), one sidecar each, no Redis.
Specification, for an SGLang and a vLLM engine:
* the holder's mirror ids (the fleet's word tokenizer: CRC-32s up to 2**31) sent as token ids, as
  pre-warm did before, are refused by such an engine (400 naming the vocabulary);
* ``GET /prefixfleet/prefix/{hash}`` answers the request that cached the prefix (route and body as
  the client sent it) and never its ``Authorization`` header;
* ``POST /prefixfleet/warm`` on a cold replica warms a text prefix, a chat prefix (replayed through
  the chat route: the engine applies its own template) and a prefix the client sent as its own token
  ids (replayed as those ids); the replays are prefill-only (not streamed, one token at most); the
  next request for each prefix on the cold replica is a cache hit;
* the tenant's ``cache_salt`` is kept: tenant A's warmed prefix is no hit for tenant B;
* a holder that keeps no request (``--warm-exemplar-bytes 0``) fails the prefix with that reason,
  and the cold replica's engine is sent nothing for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from fleet_fixtures import Spawner, eventually, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.router.blockhash import CacheIdentity, block_hashes, salted_seed
from prefixfleet.tokenizer import render_chat, tokenize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

VOCAB = 1000
MODEL = "emulated-llm"  # the emulator's default served model name
SECRET = "Bearer sk-do-not-keep-me"
TENANT_A, TENANT_B = "tenant-a", "tenant-b"
TEXT = "the billing assistant of the warm-up tenant reads the refund policy first " * 10
SYSTEM = "you are the travel desk of the warm-up tenant: answer about flights and hotels " * 8
CLIENT_IDS = [(7 * i + 3) % VOCAB for i in range(96)]  # the client's own ids, all in the vocabulary


@dataclass(frozen=True)
class Replica:
    engine: str
    sidecar: str


def start(spawn: Spawner, api: str, name: str, *sidecar_flags: str, engine: str | None = None) -> Replica:
    """An emulator (``api``'s face, vocabulary of VOCAB ids; reused when ``engine`` is given) and a
    sidecar in front of it."""
    if engine is None:
        port = free_port()
        report = ["--enable-cache-report"]
        flags = ["--api", "vllm", "--enable-prompt-tokens-details"] if api == "vllm" else report
        argv = [
            "--port",
            str(port),
            "--time-scale",
            "50",
            "--cache-tokens",
            "20000",
            "--vocab-size",
            str(VOCAB),
        ]
        proc = spawn(prefixfleet_argv("emulator", *argv, *flags), name=f"engine-{name}")
        engine = f"http://127.0.0.1:{port}"
        wait_for_http(f"{engine}/health", proc=proc.proc)
    port = free_port()
    argv = ["--engine", engine, "--port", str(port), "--worker-id", name, *sidecar_flags]
    sidecar = spawn(prefixfleet_argv("router", "sidecar", *argv), name=f"sidecar-{name}")
    wait_for_http(f"http://127.0.0.1:{port}/prefixfleet/status", proc=sidecar.proc)
    return Replica(engine, f"http://127.0.0.1:{port}")


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str
) -> tuple[int, str]:
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.text()


def cached_of(answer: str) -> int:
    """Cached prompt tokens an engine reported: /generate's meta_info, else OpenAI usage (a stream's
    last usage event)."""
    if answer.startswith("data:"):
        events = [json.loads(line[5:]) for line in answer.splitlines() if line.startswith("data: {")]
        obj = next(e for e in reversed(events) if e.get("usage"))
    else:
        obj = json.loads(answer)
    if "meta_info" in obj:
        return obj["meta_info"]["cached_tokens"]
    return (obj["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def text_request(api: str, text: str | list[int], salt: str | None) -> tuple[str, dict[str, Any]]:
    """A single-prompt generation of ``text`` (or the client's token ids) as a client of ``api`` sends it."""
    if api == "vllm":
        body: dict[str, Any] = {"model": MODEL, "prompt": text, "max_tokens": 2}
        path = "/v1/completions"
    else:
        field = "text" if isinstance(text, str) else "input_ids"
        body, path = {field: text, "sampling_params": {"max_new_tokens": 2}}, "/generate"
    if salt is not None:
        body["cache_salt"] = salt
    return path, body


def chat_request(question: str, salt: str | None) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    return body | ({"cache_salt": salt} if salt else {})


def chat_tokens(question: str) -> list[int]:
    return list(tokenize(render_chat(chat_request(question, None)["messages"])))


def shared_prefix(a: list[int], b: list[int], block: int) -> list[int]:
    """The whole blocks ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[: n // block * block]


async def prefix_hash(
    http: aiohttp.ClientSession, replica: Replica, tokens: list[int], salt: str | None
) -> str:
    async with http.get(f"{replica.sidecar}/prefixfleet/status") as resp:
        status = await resp.json()
    seed = salted_seed(CacheIdentity(status["model"], status["revision"], "").seed(), salt)
    return f"{block_hashes(tokens, seed, status['block_tokens'])[-1]:016x}"


async def learned(http: aiohttp.ClientSession, replica: Replica, api: str) -> None:
    async def engine_api() -> str:
        async with http.get(f"{replica.sidecar}/prefixfleet/status") as resp:
            return (await resp.json())["engine_api"]

    await eventually(engine_api, 30, "the sidecar to learn its engine", done=lambda got: got == api)


@pytest.mark.parametrize("api", ["sglang", "vllm"])
async def test_a_cold_replica_is_warmed_with_the_engines_own_tokens(spawn: Spawner, api: str) -> None:
    holder, cold = start(spawn, api, "holder"), start(spawn, api, "cold")
    # the same engine as the holder, behind a sidecar that keeps no request
    forgetful = start(spawn, api, "forgetful", "--warm-exemplar-bytes", "0", engine=holder.engine)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for replica in (holder, cold, forgetful):
            await learned(http, replica, api)
        async with http.get(f"{holder.sidecar}/prefixfleet/status") as resp:
            block = (await resp.json())["block_tokens"]

        # the holder serves tenant A a text prompt (with credentials), a streamed chat, and an
        # unsalted prompt of the client's own token ids
        path, body = text_request(api, TEXT + "first question?", TENANT_A)
        status, answer = await post(http, holder.sidecar + path, body, Authorization=SECRET)
        assert status == 200, answer
        chat = chat_request("which hotel is near the airport?", TENANT_A)
        status, answer = await post(http, f"{holder.sidecar}/v1/chat/completions", chat, Authorization=SECRET)
        assert status == 200, answer
        ids_path, ids_body = text_request(api, CLIENT_IDS, None)
        status, answer = await post(http, holder.sidecar + ids_path, ids_body)
        assert status == 200, answer

        text_tokens = shared_prefix(list(tokenize(TEXT + "first")), list(tokenize(TEXT + "second")), block)
        chat_prefix = shared_prefix(chat_tokens("which hotel?"), chat_tokens("is my flight late?"), block)
        ids_prefix = CLIENT_IDS[: len(CLIENT_IDS) // block * block]
        text_sid = await prefix_hash(http, holder, text_tokens, TENANT_A)
        chat_sid = await prefix_hash(http, holder, chat_prefix, TENANT_A)
        ids_sid = await prefix_hash(http, holder, ids_prefix, None)

        # what the holder answers for the text prefix: the request as sent, never its credentials
        async with http.get(f"{holder.sidecar}/prefixfleet/prefix/{text_sid}") as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.text()
        held = json.loads(raw)
        assert held["request"]["path"] == path and held["request"]["body"] == body
        assert "sk-do-not-keep-me" not in raw and "Authorization" not in raw

        # the old replay, the holder's mirror ids as token ids, is refused by the real-vocabulary engine
        mirror_ids = held["mirror_token_ids"]
        assert max(mirror_ids) >= VOCAB
        old_path, old_body = text_request(api, mirror_ids, TENANT_A)
        status, answer = await post(http, cold.sidecar + old_path, old_body)
        assert status == 400 and "vocab" in answer, answer

        warm = {"source": holder.sidecar, "hashes": [text_sid, chat_sid, ids_sid]}
        status, answer = await post(http, f"{cold.sidecar}/prefixfleet/warm", warm)
        assert status == 200, answer
        results = json.loads(answer)["results"]
        assert {sid: r["status"] for sid, r in results.items()} == dict.fromkeys(warm["hashes"], "ok"), (
            results
        )
        assert [results[s]["tokens"] for s in warm["hashes"]] == [
            len(text_tokens),
            len(chat_prefix),
            len(ids_prefix),
        ]

        # the chat prefix was replayed through the chat route, prefill-only (the cold sidecar kept
        # the replay as it sent it)
        async with http.get(f"{cold.sidecar}/prefixfleet/prefix/{chat_sid}") as resp:
            replay = (await resp.json())["request"]
        assert replay["path"] == "/v1/chat/completions"
        assert replay["body"]["max_tokens"] == 1 and replay["body"]["cache_salt"] == TENANT_A
        assert "stream" not in replay["body"] and "stream_options" not in replay["body"]

        # tenant B shares none of tenant A's warmed cache...
        path, body = text_request(api, TEXT + "second question?", TENANT_B)
        status, answer = await post(http, cold.sidecar + path, body)
        assert status == 200 and cached_of(answer) == 0, answer
        # ...and tenant A's next requests for each prefix are hits on the whole prefix
        path, body = text_request(api, TEXT + "second question?", TENANT_A)
        status, answer = await post(http, cold.sidecar + path, body)
        assert status == 200 and cached_of(answer) >= len(text_tokens), answer
        chat = chat_request("is my flight late?", TENANT_A)
        status, answer = await post(http, f"{cold.sidecar}/v1/chat/completions", chat)
        assert status == 200 and cached_of(answer) >= len(chat_prefix), answer
        path, body = text_request(api, [*CLIENT_IDS, 1, 2, 3], None)
        status, answer = await post(http, cold.sidecar + path, body)
        assert status == 200 and cached_of(answer) >= len(ids_prefix), answer

        # a holder that keeps no request: the prefix fails with the reason, no fake ids are sent
        other = "an unrelated prompt about the weather in the harbour town this morning " * 8
        path, body = text_request(api, other + "first?", None)
        status, answer = await post(http, forgetful.sidecar + path, body)
        assert status == 200, answer
        other_tokens = shared_prefix(list(tokenize(other + "first?")), list(tokenize(other + "x")), block)
        other_sid = await prefix_hash(http, forgetful, other_tokens, None)
        warm = {"source": forgetful.sidecar, "hashes": [other_sid]}
        status, answer = await post(http, f"{cold.sidecar}/prefixfleet/warm", warm)
        assert status == 200, answer
        result = json.loads(answer)["results"][other_sid]
        assert result["status"] == "failed" and "no request holding this prefix" in result["error"], result
        path, body = text_request(api, other + "second?", None)
        status, answer = await post(http, cold.sidecar + path, body)
        assert status == 200 and cached_of(answer) == 0, answer
