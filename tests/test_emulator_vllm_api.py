"""The emulator's vLLM face (`prefixfleet emulator --api vllm`) over real HTTP on 127.0.0.1.

Specification (vLLM's OpenAI-compatible server, stored source of vllm-project/vllm; docs/emulator.md
"vLLM mode"):
* prefix-cache hits are whole blocks (--block-size, default 16) and never the whole prompt: a repeat
  of an n-token prompt reports floor((n - 1) / 16) * 16 cached tokens (kv_cache_manager.py);
* usage.prompt_tokens_details is {"cached_tokens": N} only with --enable-prompt-tokens-details (then
  also for N = 0), null without it; a stream carries usage only with stream_options.include_usage,
  as a last event with no choices before [DONE] (completion/serving.py);
* /reset_prefix_cache exists only with VLLM_SERVER_DEV_MODE=1; SGLang's routes do not exist (404);
* /metrics: vllm:* series labelled model_name and engine; vllm:cache_config_info carries block_size
  and num_gpu_blocks, whose product is the emulator's --cache-tokens;
* bad input gets vLLM's ErrorResponse {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.emulator import EmulatorConfig, EmulatorServer, VllmOptions
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

CACHE_TOKENS = 40_000
FAST = dict(time_scale=200.0, cache_tokens=CACHE_TOKENS)


def words(n: int, stem: str) -> str:
    return " ".join(f"{stem}{i}" for i in range(n))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def serving(options: VllmOptions) -> EmulatorServer:
    return await EmulatorServer(EmulatorConfig(**FAST), vllm=options).start()  # type: ignore[arg-type]


@pytest.fixture
async def detailed() -> AsyncIterator[EmulatorServer]:
    server = await serving(VllmOptions(enable_prompt_tokens_details=True))
    yield server
    await server.stop()


@pytest.fixture
async def plain() -> AsyncIterator[EmulatorServer]:
    server = await serving(VllmOptions())
    yield server
    await server.stop()


async def post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


async def events(http: aiohttp.ClientSession, url: str, body: object) -> list[object]:
    async with http.post(url, json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    out: list[object] = []
    for block in filter(str.strip, raw.split("\n\n")):
        assert block.startswith("data: ")
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# -- cache hits: whole blocks, never the whole prompt ------------------------------------------------


@pytest.mark.parametrize(("length", "cached"), [(40, 32), (48, 32), (49, 48), (15, 0), (17, 16)])
async def test_a_repeat_reports_whole_blocks_short_of_the_prompt(detailed, http, length: int, cached: int):
    body = {"prompt": words(length, "a"), "max_tokens": 2}
    status, first = await post(http, detailed.url + "/v1/completions", body)
    assert status == 200 and first["usage"]["prompt_tokens"] == length
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # present at 0 with the flag
    _, again = await post(http, detailed.url + "/v1/completions", body)
    hit = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hit == cached and hit % 16 == 0 and hit < length


async def test_block_size_flag_sets_the_granularity(http):
    server = await serving(VllmOptions(block_size=32, enable_prompt_tokens_details=True))
    try:
        body = {"prompt": words(100, "b"), "max_tokens": 1}
        await post(http, server.url + "/v1/completions", body)
        _, again = await post(http, server.url + "/v1/completions", body)
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
    finally:
        await server.stop()


async def test_chat_follow_up_hits_the_blocks_of_the_previous_turn(detailed, http):
    messages = [{"role": "system", "content": words(70, "sys")}, {"role": "user", "content": "hi"}]
    status, first = await post(
        http, detailed.url + "/v1/chat/completions", {"messages": messages, "max_tokens": 4}
    )
    assert status == 200 and first["object"] == "chat.completion"
    turn = [*messages, first["choices"][0]["message"], {"role": "user", "content": "more"}]
    _, second = await post(http, detailed.url + "/v1/chat/completions", {"messages": turn, "max_tokens": 4})
    hit = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the whole first conversation (70+ tokens) is shared; counted in whole blocks only
    assert hit >= 64 and hit % 16 == 0 and hit < second["usage"]["prompt_tokens"]


async def test_a_batch_reports_one_prompts_count_as_vllm_does(detailed, http):
    warm, cold = words(40, "h"), words(40, "i")
    await post(http, detailed.url + "/v1/completions", {"prompt": warm, "max_tokens": 1})
    _, answer = await post(http, detailed.url + "/v1/completions", {"prompt": [cold, warm], "max_tokens": 1})
    assert answer["usage"]["prompt_tokens"] == 80 and len(answer["choices"]) == 2
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}  # the last prompt's


async def test_cache_salts_keep_tenants_apart(detailed, http):
    body = {"prompt": words(40, "j"), "max_tokens": 1}
    await post(http, detailed.url + "/v1/completions", {**body, "cache_salt": "tenant-a"})
    _, other = await post(http, detailed.url + "/v1/completions", {**body, "cache_salt": "tenant-b"})
    _, unsalted = await post(http, detailed.url + "/v1/completions", body)
    _, same = await post(http, detailed.url + "/v1/completions", {**body, "cache_salt": "tenant-a"})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert unsalted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


# -- usage -------------------------------------------------------------------------------------------


async def test_details_are_null_without_the_flag(plain, http):
    body = {"prompt": words(40, "c"), "max_tokens": 2}
    await post(http, plain.url + "/v1/completions", body)
    _, again = await post(http, plain.url + "/v1/completions", body)
    usage = again["usage"]
    assert usage["prompt_tokens_details"] is None
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] == 42
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    _, answer = await post(http, plain.url + "/v1/chat/completions", chat)
    assert answer["usage"]["prompt_tokens_details"] is None
    # in a stream's usage event vLLM leaves a null out (exclude_none)
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    usage_event = (await events(http, plain.url + "/v1/completions", stream))[-2]
    assert "prompt_tokens_details" not in usage_event["usage"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_streams_carry_usage_only_when_asked(detailed, http, route: str):
    body: dict = {"max_tokens": 3, "stream": True}
    if route == "/v1/completions":
        body["prompt"] = words(40, "d")
    else:
        body["messages"] = [{"role": "user", "content": words(40, "d")}]
    without = await events(http, detailed.url + route, body)
    assert without[-1] == "[DONE]" and all(e == "[DONE]" or "usage" not in e for e in without)
    asked = await events(http, detailed.url + route, {**body, "stream_options": {"include_usage": True}})
    *chunks, usage_event, done = asked
    assert done == "[DONE]"
    assert usage_event["choices"] == [] and usage_event["id"] == chunks[0]["id"]
    usage = usage_event["usage"]
    assert usage["completion_tokens"] == 3 and usage["total_tokens"] == usage["prompt_tokens"] + 3
    assert usage["prompt_tokens_details"]["cached_tokens"] % 16 == 0
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # vLLM's StreamOptions.include_usage defaults to true: stream_options {} asks for usage too
    empty = await events(http, detailed.url + route, {**body, "stream_options": {}})
    assert empty[-2]["choices"] == [] and "usage" in empty[-2]


@pytest.mark.parametrize(
    ("limits", "generated"),
    [({"max_completion_tokens": 3, "max_tokens": 5}, 3), ({"max_tokens": 5}, 5),
     ({"max_completion_tokens": 0, "max_tokens": 2}, 2), ({}, 128)],
)  # fmt: skip
async def test_chat_output_length_as_vllm_reads_its_two_limits(plain, http, limits: dict, generated: int):
    body = {"messages": [{"role": "user", "content": "count"}], **limits}
    status, answer = await post(http, plain.url + "/v1/chat/completions", body)
    assert status == 200 and answer["usage"]["completion_tokens"] == generated


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(plain, http, route: str):
    prompt = words(20, "k")
    body: dict = {"max_tokens": 3, "stream": True}
    body |= (
        {"prompt": prompt}
        if route == "/v1/completions"
        else {"messages": [{"role": "user", "content": prompt}]}
    )
    options = {"include_usage": True, "continuous_usage_stats": True}
    *chunks, last, done = await events(http, plain.url + route, {**body, "stream_options": options})
    assert done == "[DONE]" and last["choices"] == []
    prompt_tokens = last["usage"]["prompt_tokens"]
    so_far = [c["usage"]["completion_tokens"] for c in chunks]
    assert so_far[-3:] == [1, 2, 3] and all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    assert all(c["usage"]["total_tokens"] == prompt_tokens + c["usage"]["completion_tokens"] for c in chunks)
    # without include_usage vLLM sends no usage at all, continuous or not
    quiet = {**body, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert all(e == "[DONE]" or "usage" not in e for e in await events(http, plain.url + route, quiet))


async def test_chat_stream_names_the_role_first(plain, http):
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "stream": True}
    chunks = await events(http, plain.url + "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert len(tokenize(text)) == 2 and not text.startswith(" ")


# -- routes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/generate"), ("GET", "/get_server_info"), ("GET", "/get_model_info"), ("GET", "/flush_cache"),
     ("POST", "/flush_cache"), ("GET", "/get_load"), ("GET", "/health_generate")],
)  # fmt: skip
async def test_sglang_routes_do_not_exist(plain, http, method: str, path: str):
    async with http.request(method, plain.url + path, json={"text": "x"}) as r:
        assert r.status == 404
        assert await r.json() == {"detail": "Not Found"}  # FastAPI's answer


async def test_reset_prefix_cache_exists_only_in_dev_mode(plain, http):
    async with http.post(plain.url + "/reset_prefix_cache") as r:
        assert r.status == 404
    server = await serving(VllmOptions(enable_prompt_tokens_details=True, dev_mode=True))
    try:
        body = {"prompt": words(40, "e"), "max_tokens": 1}
        await post(http, server.url + "/v1/completions", body)
        _, warm = await post(http, server.url + "/v1/completions", body)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
        async with http.post(server.url + "/reset_prefix_cache") as r:
            assert r.status == 200 and await r.read() == b""
        assert server.engine.model.tree.cached_tokens == 0
        _, cold = await post(http, server.url + "/v1/completions", body)
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        await server.stop()


async def test_info_routes_look_like_vllm(plain, http):
    async with http.get(plain.url + "/health") as r:
        assert r.status == 200 and await r.read() == b""
    async with http.get(plain.url + "/version") as r:
        assert isinstance((await r.json())["version"], str)
    async with http.get(plain.url + "/v1/models") as r:
        listing = await r.json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["id"] == "emulated-llm" and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["parent"] is None and card["root"] == "emulated-llm" and isinstance(card["created"], int)
    assert card["permission"][0]["object"] == "model_permission"
    assert 0 < card["max_model_len"] <= CACHE_TOKENS


async def test_tokenize_and_detokenize(plain, http):
    status, tok = await post(
        http, plain.url + "/tokenize", {"prompt": "hello vllm world", "return_token_strs": True}
    )
    assert status == 200
    assert tok["count"] == 3 and tok["tokens"] == list(tokenize("hello vllm world"))
    assert tok["token_strs"] == ["hello", "vllm", "world"] and tok["max_model_len"] > 0
    status, back = await post(http, plain.url + "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and back == {"prompt": "hello vllm world"}
    _, chat = await post(http, plain.url + "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat["count"] == len(chat["tokens"]) > 1 and chat["token_strs"] is None


# -- metrics -------------------------------------------------------------------------------------------


async def test_metrics_parse_with_vllm_names_and_labels(detailed, http):
    body = {"prompt": words(40, "f"), "max_tokens": 2}
    await post(http, detailed.url + "/v1/completions", body)
    await post(http, detailed.url + "/v1/completions", body)
    async with http.get(detailed.url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, kind in expected.items():
        assert families[name].type == kind, name
    assert not [n for n in families if n.startswith("sglang:")]

    def value(sample_name: str) -> float:
        (sample,) = [
            s for f in families.values() for s in f.samples if s.name == sample_name and "le" not in s.labels
        ]
        assert sample.labels["model_name"] == "emulated-llm" and sample.labels["engine"] == "0"
        return sample.value

    assert value("vllm:prefix_cache_queries_total") == 80  # tokens queried, both requests
    assert value("vllm:prefix_cache_hits_total") == 32  # the repeat's two whole blocks
    assert value("vllm:prompt_tokens_total") == 80
    assert value("vllm:generation_tokens_total") == 4
    (success,) = families["vllm:request_success"].samples[:1]
    assert success.labels["finished_reason"] == "length" and success.value == 2
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1 and info.labels["block_size"] == "16"
    assert int(info.labels["block_size"]) * int(info.labels["num_gpu_blocks"]) == CACHE_TOKENS


# -- bad input: vLLM's error shape, never a crash ---------------------------------------------------------


def assert_vllm_error(answer: dict, status: int, code: int, kind: str, param: str | None = "any") -> None:
    assert status == code
    assert set(answer) == {"error"}, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == kind and error["message"]
    if param != "any":
        assert error["param"] == param


@pytest.mark.parametrize(
    ("route", "body", "code", "kind", "param"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "BadRequestError", "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "Bad Request", None),
        ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "NotFoundError", "model"),
        ("/v1/completions", {"prompt": ""}, 400, "Bad Request", "prompt"),
        ("/v1/completions", {"max_tokens": 3}, 400, "Bad Request", "prompt"),
        ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "Bad Request",
         "stream_options"),
        ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "BadRequestError", "temperature"),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "BadRequestError", "top_p"),
        ("/v1/completions", {"prompt": "x", "top_k": -5}, 400, "BadRequestError", "top_k"),
        ("/v1/completions", {"prompt": [1, -2]}, 400, "BadRequestError", "prompt"),
        ("/v1/completions", {"prompt": [1, 2.5]}, 400, "Bad Request", None),
        ("/v1/completions", {"prompt": [2**31]}, 400, "BadRequestError", "prompt"),
        ("/v1/completions", {"prompt": "x", "cache_salt": ""}, 400, "Bad Request", "cache_salt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 10**7}, 400, "BadRequestError", "max_tokens"),
        ("/v1/completions", {"prompt": words(CACHE_TOKENS, "g")}, 400, "BadRequestError", "input_tokens"),
        ("/v1/completions", {"prompt": words(CACHE_TOKENS - 10, "g")}, 400, "BadRequestError", "max_tokens"),
        ("/v1/completions", [1, 2], 400, "Bad Request", None),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "Bad Request", None),
        ("/v1/chat/completions", {"messages": []}, 400, "BadRequestError", "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "BadRequestError", "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
         400, "BadRequestError", "max_tokens"),
        ("/tokenize", {}, 400, "Bad Request", "prompt"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "NotFoundError", "model"),
        ("/detokenize", {"tokens": ["x"]}, 400, "Bad Request", None),
        ("/detokenize", {"tokens": [2**40]}, 400, "BadRequestError", "tokens"),
    ],
)  # fmt: skip
async def test_bad_input_gets_vllms_error_shape(plain, http, route, body, code, kind, param):
    status, answer = await post(http, plain.url + route, body)
    assert_vllm_error(answer, status, code, kind, param)


async def test_bodies_that_are_not_json_are_refused_as_vllm_does(plain, http):
    async with http.post(
        plain.url + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as r:
        assert_vllm_error(await r.json(), r.status, 400, "Bad Request")
    async with http.post(plain.url + "/v1/completions", data=b'{"prompt": "x"}') as r:  # no JSON content type
        answer = await r.json()
        assert_vllm_error(answer, r.status, 400, "Bad Request")
        assert "application/json" in answer["error"]["message"]
    async with http.get(plain.url + "/v1/completions") as r:
        assert r.status == 405 and await r.json() == {"detail": "Method Not Allowed"}
    # and the engine still serves
    status, _ = await post(http, plain.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 200


ODD_VALUES = [None, "x", "", -1, 0, 1.5, 2**80, [], [1], {}, {"a": 1}, True, float("nan")]
COMPLETION_FIELDS = ["prompt", "max_tokens", "model", "n", "stream", "stream_options", "temperature",
                     "top_p", "top_k", "min_p", "cache_salt", "echo", "stop"]  # fmt: skip
CHAT_FIELDS = ["messages", "max_tokens", "max_completion_tokens", "model", "stream", "stream_options",
               "presence_penalty", "repetition_penalty", "cache_salt"]  # fmt: skip
FIELDS = {
    "/v1/completions": ({"prompt": "a b", "max_tokens": 1}, COMPLETION_FIELDS),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}, CHAT_FIELDS),
    "/tokenize": ({"prompt": "a b"}, ["prompt", "messages", "model", "return_token_strs"]),
    "/detokenize": ({"tokens": [1]}, ["tokens", "model"]),
}


@pytest.mark.parametrize("route", list(FIELDS))
async def test_no_odd_field_value_crashes_the_server(plain, http, route: str):
    base, fields = FIELDS[route]
    for field in fields:
        for value in ODD_VALUES:
            body = {**base, field: value}
            async with http.post(
                plain.url + route, data=json.dumps(body), headers={"Content-Type": "application/json"}
            ) as r:
                raw = await r.read()
                assert r.status < 500, (field, value, raw)
                if r.status != 200:
                    assert_vllm_error(json.loads(raw), r.status, r.status, json.loads(raw)["error"]["type"])
