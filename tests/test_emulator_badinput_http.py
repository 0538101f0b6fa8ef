"""Malformed requests to the emulator's SGLang/OpenAI API: a 4xx JSON error naming the field, never a 5xx.

Specification (beyond tests/test_emulator_server.py's BAD_REQUESTS): JSON numbers that are no usable
count (NaN, 1e400, negative, huge, a string), bodies that are not UTF-8 or nest too deep, batched
token ids with a bad entry, sampling parameters of a type or range SGLang refuses (temperature
"hot", "0.7abc" or -1, top_p 0, top_k 0 or 50.5, stop 5, ignore_eos "maybe"...), chat messages
SGLang's request models refuse (an unknown role, "User", a content part that is no typed object, a
text part whose text is no string) and a cache_salt SGLang refuses each get a 400 whose
``error.message`` names the offending field. What SGLang's pydantic models coerce in lax mode
("0.7", 50.0, "true", a role "System") is accepted as they coerce it, what SGLang runs (max_new_tokens
2.5, a list cache_salt in a batch) runs, what it ignores (max_completion_tokens on /v1/completions) is
ignored; valid requests answer in the unchanged shape.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from openai_usage import cached_tokens

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer

USER = '{"role": "user", "content": "x"}'
CASES = [
    # (path, raw body, text the error message must contain)
    ("/generate", b"\xff\xfe{", "not valid JSON"),
    ("/generate", b"[" * 50_000 + b"]" * 50_000, "not valid JSON"),
    ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": NaN}}', "max_new_tokens"),
    ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": 1e400}}', "max_new_tokens"),
    ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": -2.5}}', "max_new_tokens"),
    ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": "2"}}', "max_new_tokens"),
    # cache_salt as SGLang normalises it: a list only in a batch, one string per prompt
    ("/generate", b'{"text": "a", "cache_salt": ["t"]}', "cache_salt must be a string for a single prompt"),
    ("/generate", b'{"text": ["a", "b"], "cache_salt": ["t"]}', "cache_salt holds 1 salts for 2 prompts"),
    ("/generate", b'{"text": ["a", "b"], "cache_salt": ["t", 5]}', "cache_salt[1] must be a string"),
    ("/generate", b'{"text": ["a", "b"], "cache_salt": 5}', "cache_salt must be a string or a list"),
    ("/v1/completions", b'{"prompt": "a", "cache_salt": ["t"]}', "cache_salt must be a string"),
    (
        "/v1/chat/completions",
        b'{"messages": [' + USER.encode() + b'], "cache_salt": ["t"]}',
        "cache_salt must be a string",
    ),
    (
        "/generate",
        b'{"text": "a", "sampling_params": {"max_new_tokens": 1' + b"0" * 40 + b"}}",
        "max_new_tokens",
    ),
    ("/generate", b'{"input_ids": [[1], [2, "x"]]}', "input_ids[1]"),
    ("/generate", b'{"input_ids": [1, 2.5]}', "input_ids[1]"),
    ("/generate", b'{"input_ids": [4294967296]}', "input_ids[0]"),
    ("/generate", b'{"text": ["a", 5]}', "text"),
    ("/generate", b'{"text": ["a", "b"], "rid": ["x"]}', "rid"),
    ("/v1/completions", b'{"prompt": ""}', "prompt"),
    ("/v1/completions", b'{"prompt": [1, 2, "x"]}', "prompt[2]"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 1e400}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "model": 5}', "model"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}', "max_tokens must be positive"),
    # null where SGLang's models type the field without Optional (chat's temperature is Optional)
    ("/v1/completions", b'{"prompt": "a", "temperature": null}', "temperature must not be null"),
    (
        "/v1/chat/completions",
        b'{"messages": [' + USER.encode() + b'], "stream": null}',
        "stream must not be null",
    ),
    ("/generate", b'{"text": "a", "stream": null}', "stream must not be null"),
    ("/generate", b'{"text": "a", "sampling_params": {"temperature": "hot"}}', "sampling_params.temperature"),
    ("/generate", b'{"text": "a", "sampling_params": {"temperature": -1}}', "sampling_params.temperature"),
    (
        "/generate",
        b'{"text": "a", "sampling_params": {"top_p": 0}}',
        "sampling_params.top_p must be in (0, 1]",
    ),
    ("/generate", b'{"text": "a", "sampling_params": {"top_k": 0}}', "sampling_params.top_k"),
    (
        "/generate",
        b'{"text": "a", "sampling_params": {"top_k": 0, "temperature": 0.5}}',
        "sampling_params.top_k",
    ),
    ("/generate", b'{"text": "a", "sampling_params": {"stop": 5}}', "sampling_params.stop"),
    ("/v1/completions", b'{"prompt": "a", "temperature": NaN}', "temperature must be a finite number"),
    # what SGLang's pydantic request models (lax mode) refuse: no number, a fractional int, no boolean
    (
        "/v1/chat/completions",
        b'{"messages": [' + USER.encode() + b'], "temperature": "0.7abc"}',
        "temperature",
    ),
    ("/v1/completions", b'{"prompt": "a", "top_k": 50.5}', "top_k must be an integer"),
    ("/v1/completions", b'{"prompt": "a", "ignore_eos": "maybe"}', "ignore_eos must be a boolean"),
    ("/v1/completions", b'{"prompt": "a", "stream": "maybe"}', "stream must be a boolean"),
    ("/v1/completions", b'{"prompt": "a", "n": "two"}', "n must be an integer"),
    ("/v1/completions", b'{"prompt": "a", "repetition_penalty": 0}', "repetition_penalty must be in (0, 2]"),
    ("/v1/completions", b'{"prompt": "a", "presence_penalty": 3}', "presence_penalty must be in [-2, 2]"),
    ("/v1/completions", b'{"prompt": "a", "stop": [1]}', "stop"),
    ("/v1/chat/completions", b'{"messages": [' + USER.encode() + b'], "top_p": 1.5}', "top_p"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role"),
    # SGLang lower-cases every role but user, which its model types Literal["user"]
    ("/v1/chat/completions", b'{"messages": [{"role": "User", "content": "x"}]}', "messages[0].role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [5]}]}', "messages[0].content[0]"),
    # part types outside SGLang's content part union, and thinking outside an assistant message
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}',
        "messages[0].content[0].type",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]}',
        "messages[0].content[0].type",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}',
        "only valid in assistant messages",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
        "messages[0].content[0].text",
    ),
    ("/v1/chat/completions", b'{"messages": [' + USER.encode() + b'], "max_tokens": -1}', "max_tokens"),
    (
        "/v1/chat/completions",
        b'{"messages": [' + USER.encode() + b'], "max_completion_tokens": "a"}',
        "max_completion_tokens",
    ),
]


@pytest.fixture
async def server() -> AsyncIterator[EmulatorServer]:
    async with EmulatorServer(
        EmulatorConfig(time_scale=200.0, cache_tokens=4_000, enable_cache_report=True)
    ) as s:
        yield s


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.mark.parametrize(("path", "raw", "names"), CASES, ids=lambda v: str(v)[:50])
async def test_a_malformed_request_is_a_400_naming_the_field(
    server: EmulatorServer, http: aiohttp.ClientSession, path: str, raw: bytes, names: str
) -> None:
    async with http.post(server.url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert names in error["message"] and error["code"] == 400 and error["type"] == "invalid_request_error"


async def test_valid_chat_content_parts_still_answer_in_the_same_shape(
    server: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    """Text parts prefilled, other typed parts (an image) skipped, as before; every SGLang role and
    in-range sampling parameters are accepted (and, as before, change nothing in the emulator)."""
    messages = [
        {"role": role, "content": f"{role} says hi"} for role in ("system", "developer", "assistant", "tool")
    ]
    messages.append(
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}],
        }
    )
    sampling = {"temperature": 0.7, "top_p": 1, "top_k": -1, "stop": ["\n"], "presence_penalty": -2}
    body = {"messages": messages, "max_tokens": 2, **sampling}
    async with http.post(server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        answer = await r.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] == 2


# What the OpenAI python SDK sends in ordinary use (tool calling, multimodal parts, nulls it leaves
# in), and SGLang's greedy rule: temperature 0 sets top_k to 1 before SGLang's check, so top_k 0 passes.
SDK_CHAT = {
    "model": "m",
    "messages": [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "name": "u1",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
        {"role": "function", "name": "f", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "content": None},
        {"role": "system"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"}],
        },
        {"role": "user", "content": "go on"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto",
    "max_completion_tokens": 2,
    "temperature": 0,
    "top_k": 0,
    "top_p": None,
    "stop": "\n",
    "seed": 1,
    "logit_bias": {},
    "response_format": {"type": "text"},
}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", SDK_CHAT),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "temperature": 0.0, "stop": ["a", "b"]}),
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0, "top_k": 0}}),
    ],
    ids=["sdk-chat", "completions", "generate-greedy"],
)
async def test_ordinary_client_requests_still_answer(
    server: EmulatorServer, http: aiohttp.ClientSession, path: str, body: dict[str, object]
) -> None:
    async with http.post(server.url + path, json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    tokens = (
        answer["meta_info"]["completion_tokens"]
        if path == "/generate"
        else answer["usage"]["completion_tokens"]
    )
    assert tokens == (2 if path == "/v1/chat/completions" else 1)


# What SGLang accepts although its type is loose: its OpenAI request models are pydantic models in lax
# mode (a float field takes "0.7", an int field 50.0 or "2", a bool field "true"/"false"/"yes"/0/1),
# FastAPI validates /generate's GenerateReqInput the same way (input_ids List[int], stream bool), and
# /generate's sampling_params dict reaches SamplingParams untyped (ignore_eos is only tested for truth).
COERCED = [
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "System", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "max_tokens": "2",
            "temperature": "0.7",
            "top_p": "1",
            "top_k": 50.0,
            "presence_penalty": " -2 ",
            "ignore_eos": "true",
            "stream": "false",
            "n": "1",
        },
    ),
    (
        "/v1/completions",
        {"prompt": [1, 2.0, "3"], "max_tokens": 2.0, "top_k": "-1", "echo": "no", "stream": 0},
    ),
    (
        "/generate",
        {
            "input_ids": [1, 2.0, "3"],
            "stream": "off",
            "sampling_params": {"max_new_tokens": 2, "ignore_eos": "yes"},
        },
    ),
]


@pytest.mark.parametrize(("path", "body"), COERCED, ids=["chat", "completions", "generate"])
async def test_loosely_typed_values_sglang_coerces_are_accepted(
    server: EmulatorServer, http: aiohttp.ClientSession, path: str, body: dict[str, object]
) -> None:
    async with http.post(server.url + path, json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    usage = answer["meta_info"] if path == "/generate" else answer["usage"]
    assert usage["completion_tokens"] == 2
    if path != "/v1/chat/completions":
        assert usage["prompt_tokens"] == 3  # [1, 2.0, "3"] is the token ids 1, 2, 3


async def test_a_role_in_another_case_is_the_same_prompt_as_sglang_lower_cases_it(
    server: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    """ "System" renders as "system": the second request finds the first one's whole prompt cached."""
    answers = []
    for role in ("system", "SYSTEM"):
        messages = [{"role": role, "content": "shared rules " * 20}, {"role": "user", "content": "hi"}]
        async with http.post(
            server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
        ) as r:
            assert r.status == 200, await r.text()
            answers.append((await r.json())["usage"])
    assert answers[1]["prompt_tokens"] == answers[0]["prompt_tokens"]
    assert cached_tokens(answers[1]) >= answers[0]["prompt_tokens"] - 1


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decode_as_its_content_encoding_is_a_400(
    server: EmulatorServer, http: aiohttp.ClientSession, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with http.post(server.url + "/generate", data=b"not compressed", headers=headers) as r:
        assert r.status == 400  # was a 500 'internal error'
        error = (await r.json())["error"]
    assert error["param"] == "body" and f"Content-Encoding '{encoding}'" in error["message"]
    await asyncio.sleep(0.2)  # aiohttp read the rest of the broken body after the answer, and logged
    assert server_errors(caplog) == []  # 'Unhandled exception' with a traceback
    valid = gzip.compress(b'{"text": "hello", "sampling_params": {"max_new_tokens": 1}}')
    headers["Content-Encoding"] = "gzip"
    # a new connection: the server closed the one whose body broke
    async with (
        aiohttp.ClientSession() as fresh,
        fresh.post(server.url + "/generate", data=valid, headers=headers) as r,
    ):
        assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 1


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "x-custom", "gzip, br"])
async def test_a_body_in_a_coding_the_emulator_cannot_decode_is_a_415_as_at_the_gateway(
    server: EmulatorServer, http: aiohttp.ClientSession, coding: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As router/content_coding.py answers at the gateway and the sidecar: br and zstd were a
    plain-text 400 'Please install Brotli' with an ERROR traceback, other codings read as plain."""
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    body = b'{"text": "hello", "sampling_params": {"max_new_tokens": 1}}'
    async with (
        aiohttp.ClientSession() as fresh,
        fresh.post(server.url + "/generate", data=body, headers=headers) as r,
    ):
        assert r.status == 415 and r.headers["Accept-Encoding"] == "gzip, deflate"
        error = (await r.json())["error"]
    assert error["param"] == "body" and f"Content-Encoding {coding!r} is not supported" in error["message"]
    assert server_errors(caplog) == []
    async with http.post(
        server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    ) as r:
        assert r.status == 200  # still serving


# --- where the emulator used to be stricter than SGLang (docs/emulator.md) ------------------------


@pytest.mark.parametrize(("max_new_tokens", "generated"), [(2.5, 3), (0.5, 1), (2.0, 2)])
async def test_a_non_integral_max_new_tokens_runs_as_sglang_runs_it(
    server: EmulatorServer, http: aiohttp.ClientSession, max_new_tokens: float, generated: int
) -> None:
    """SGLang's sampling_params reach SamplingParams untyped and a request stops once its output
    holds at least max_new_tokens tokens: 2.5 generates 3 (it was a 400 here)."""
    body = {"text": "hello there", "sampling_params": {"max_new_tokens": max_new_tokens}}
    async with http.post(server.url + "/generate", json=body) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["meta_info"]["completion_tokens"] == generated


@pytest.mark.parametrize("value", [5, 100, "not a number", None])
async def test_completions_ignore_max_completion_tokens_as_sglang_does(
    server: EmulatorServer, http: aiohttp.ClientSession, value: object
) -> None:
    """SGLang's CompletionRequest has no max_completion_tokens (only chat has): max_tokens, or its
    default 16, decides; the field is not even type-checked."""
    for extra, expected in (({}, 16), ({"max_tokens": 3}, 3)):
        body = {"prompt": "hello there", "max_completion_tokens": value, **extra}
        async with http.post(server.url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["usage"]["completion_tokens"] == expected


async def test_chat_still_honours_max_completion_tokens(
    server: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3, "max_tokens": 9}
    async with http.post(server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["usage"]["completion_tokens"] == 3


PROMPT = "a long shared system prompt " * 12


async def _cached(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> list[int]:
    """Cached tokens of each prompt (/generate), or of all of them (/v1/completions sums usage)."""
    async with http.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    if isinstance(answer, list):
        return [a["meta_info"]["cached_tokens"] for a in sorted(answer, key=lambda a: a["index"])]
    if "meta_info" in answer:
        return [answer["meta_info"]["cached_tokens"]]
    return [cached_tokens(answer["usage"])]


async def test_a_generate_batch_takes_one_cache_salt_per_prompt(
    server: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    """A list cache_salt in a batch salts each prompt with its own entry ("" is none), as SGLang's
    GenerateReqInput normalises it: the same prompt is cached only under the salt it was run with."""
    url, one = server.url + "/generate", {"sampling_params": {"max_new_tokens": 1}}
    assert await _cached(http, url, {"text": PROMPT, "cache_salt": "tenant-a", **one}) == [0]
    assert await _cached(http, url, {"text": PROMPT, **one}) == [0]  # unsalted: a cache of its own
    salts = ["tenant-a", "tenant-b", ""]
    cached = await _cached(http, url, {"text": [PROMPT] * 3, "cache_salt": salts, **one})
    assert cached[0] > 0 and cached[1] == 0 and cached[2] > 0, cached
    # a string salts every prompt of the batch alike
    assert min(await _cached(http, url, {"text": [PROMPT] * 2, "cache_salt": "tenant-b", **one})) > 0


async def test_a_completions_batch_takes_one_cache_salt_per_prompt(
    server: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    url, one = server.url + "/v1/completions", {"max_tokens": 1}
    assert await _cached(http, url, {"prompt": PROMPT, "cache_salt": "tenant-a", **one}) == [0]
    [hit] = await _cached(http, url, {"prompt": PROMPT, "cache_salt": "tenant-a", **one})
    assert hit > 0
    # usage sums the batch: the tenant-a prompt hits, the tenant-b one finds nothing
    both = {"prompt": [PROMPT, PROMPT], "cache_salt": ["tenant-a", "tenant-b"], **one}
    assert await _cached(http, url, both) == [hit]
    assert await _cached(http, url, {"prompt": PROMPT, "cache_salt": "tenant-b", **one}) == [hit]
