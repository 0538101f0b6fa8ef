"""The emulator's HTTP API over real HTTP on 127.0.0.1 (in-process server, high time-scale)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer, start_emulator
from prefixfleet.router.slow_clients import BODY_TIMEOUT_ENV
from prefixfleet.tokenizer import count_tokens, render_chat

FAST = dict(time_scale=200.0, cache_tokens=50_000, enable_cache_report=True)
SYSTEM = " ".join(f"rule{i}" for i in range(400))  # a 400-token shared system prompt


@pytest.fixture
async def server() -> AsyncIterator[EmulatorServer]:
    async with EmulatorServer(EmulatorConfig(**FAST)) as s:  # type: ignore[arg-type]
        yield s


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, object]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


async def sse(http: aiohttp.ClientSession, url: str, body: object) -> list[object]:
    """All events of a streamed answer; the terminal [DONE] kept as the string "[DONE]"."""
    events: list[object] = []
    async with http.post(url, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: ")
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# -- info endpoints ------------------------------------------------------------------------------


async def test_health_and_info_endpoints_look_like_sglang(server: EmulatorServer, http):
    async with http.get(server.url + "/health") as r:
        assert r.status == 200
    for path in ("/get_server_info", "/server_info"):
        async with http.get(server.url + path) as r:
            info = await r.json()
        assert info["model_path"] == info["served_model_name"] == "emulated-llm"
        assert info["max_total_num_tokens"] == 50_000
        assert info["page_size"] == 1
        assert {"chunked_prefill_size", "max_running_requests", "version", "emulator"} <= set(info)
    for path in ("/get_model_info", "/model_info"):
        async with http.get(server.url + path) as r:
            assert await r.json() == {
                "model_path": "emulated-llm",
                "tokenizer_path": "emulated-llm",
                "is_generation": True,
                "served_model_name": "emulated-llm",
                "weight_version": "main",
                "preferred_sampling_params": None,
            }
    async with http.get(server.url + "/v1/models") as r:
        models = await r.json()
    assert models["object"] == "list" and models["data"][0]["id"] == "emulated-llm"
    async with http.get(server.url + "/get_load") as r:
        load = await r.json()
    assert load == [
        {"dp_rank": 0, "num_reqs": 0, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    ]
    async with http.get(server.url + "/health_generate") as r:
        assert r.status == 200


# -- /generate -----------------------------------------------------------------------------------


async def test_generate_reports_cached_prefix_tokens_on_a_repeat(server: EmulatorServer, http):
    body = {"text": SYSTEM + " first question", "sampling_params": {"max_new_tokens": 8}}
    status, cold = await post(http, server.url + "/generate", body)
    assert status == 200
    meta = cold["meta_info"]
    assert meta["prompt_tokens"] == 402 and meta["completion_tokens"] == 8 and meta["cached_tokens"] == 0
    assert meta["finish_reason"]["type"] == "length"
    assert count_tokens(cold["text"]) == 8
    assert meta["e2e_latency"] > 0 and meta["id"]

    status, warm = await post(
        http,
        server.url + "/generate",
        {"text": SYSTEM + " second one", "sampling_params": {"max_new_tokens": 4}},
    )
    assert status == 200 and warm["meta_info"]["cached_tokens"] == 400


async def test_generate_accepts_token_ids_batches_and_a_request_id(server: EmulatorServer, http):
    status, single = await post(
        http,
        server.url + "/generate",
        {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}, "rid": "x1"},
    )
    assert status == 200 and single["meta_info"]["id"] == "x1" and single["meta_info"]["prompt_tokens"] == 3

    status, batch = await post(
        http,
        server.url + "/generate",
        {"text": ["one two", "three four five"], "sampling_params": {"max_new_tokens": 3}},
    )
    assert status == 200 and isinstance(batch, list)
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [2, 3]
    assert [b["index"] for b in batch] == [0, 1]


async def test_same_prompt_gives_the_same_deterministic_text(server: EmulatorServer, http):
    body = {"text": "tell me a story", "sampling_params": {"max_new_tokens": 12}}
    _, a = await post(http, server.url + "/generate", body)
    _, b = await post(http, server.url + "/generate", body)
    assert a["text"] == b["text"] and count_tokens(a["text"]) == 12


async def test_streamed_generate_sends_cumulative_text_and_ends_with_done(server: EmulatorServer, http):
    events = await sse(
        http,
        server.url + "/generate",
        {"text": "stream me", "sampling_params": {"max_new_tokens": 5}, "stream": True},
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5]
    texts = [c["text"] for c in chunks]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


async def test_prefill_only_request_warms_the_cache(server: EmulatorServer, http):
    status, warm = await post(
        http, server.url + "/generate", {"text": SYSTEM, "sampling_params": {"max_new_tokens": 0}}
    )
    assert status == 200
    assert warm["text"] == "" and warm["meta_info"]["completion_tokens"] == 0
    assert warm["meta_info"]["prompt_tokens"] == 400
    events = await sse(
        http,
        server.url + "/generate",
        {"text": SYSTEM, "sampling_params": {"max_new_tokens": 0}, "stream": True},
    )
    # an exact repeat: SGLang matches at most all but the last prompt token, which it computes
    assert events[-1] == "[DONE]" and events[0]["meta_info"]["cached_tokens"] == 399
    _, hit = await post(
        http,
        server.url + "/generate",
        {"text": SYSTEM + " now ask", "sampling_params": {"max_new_tokens": 1}},
    )
    assert hit["meta_info"]["cached_tokens"] == 400


# -- OpenAI-compatible -----------------------------------------------------------------------------


async def test_completions_have_openai_shape_with_cached_token_usage(server: EmulatorServer, http):
    body = {"model": "emulated-llm", "prompt": SYSTEM + " q", "max_tokens": 6}
    status, first = await post(http, server.url + "/v1/completions", body)
    assert status == 200
    assert first["object"] == "text_completion" and first["model"] == "emulated-llm"
    choice = first["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length" and count_tokens(choice["text"]) == 6
    assert first["usage"] == {
        "prompt_tokens": 401,
        "completion_tokens": 6,
        "total_tokens": 407,
        "prompt_tokens_details": None,  # SGLang sends null, not 0 cached tokens
    }
    _, second = await post(http, server.url + "/v1/completions", body)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 400  # all but the last token


async def test_streamed_completions_send_deltas_usage_and_done(server: EmulatorServer, http):
    events = await sse(
        http,
        server.url + "/v1/completions",
        {"prompt": "abc def", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    deltas = events[:-2]
    assert "".join(d["choices"][0]["text"] for d in deltas).split() and len(deltas) == 4
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    _, whole = await post(http, server.url + "/v1/completions", {"prompt": "abc def", "max_tokens": 4})
    assert "".join(d["choices"][0]["text"] for d in deltas) == whole["choices"][0]["text"]


async def test_chat_completions_and_the_next_turn_hits_the_previous_answer(server: EmulatorServer, http):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    status, first = await post(
        http, server.url + "/v1/chat/completions", {"messages": messages, "max_tokens": 10}
    )
    assert status == 200 and first["object"] == "chat.completion"
    answer = first["choices"][0]["message"]
    assert answer["role"] == "assistant" and count_tokens(answer["content"]) == 10
    assert first["usage"]["prompt_tokens"] == count_tokens(render_chat(messages))

    turn2 = [
        *messages,
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": "more"},
    ]
    _, second = await post(http, server.url + "/v1/chat/completions", {"messages": turn2, "max_tokens": 2})
    # The whole first turn, including the generated answer, was cached by the engine.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["total_tokens"]


async def test_streamed_chat_sends_role_then_content_deltas_and_done(server: EmulatorServer, http):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    events = await sse(http, server.url + "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert count_tokens(content) == 3 and not content.startswith(" ")
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# -- metrics -----------------------------------------------------------------------------------------


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


async def test_metrics_use_sglang_names_and_counters_move(server: EmulatorServer, http):
    async with http.get(server.url + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        before = await r.text()
    names = [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:gen_throughput",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:num_requests_total",
        "sglang:time_to_first_token_seconds_count",
        "sglang:inter_token_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_count",
    ]
    for name in names:
        assert metric_value(before, name) == 0.0
    assert 'model_name="emulated-llm"' in before

    body = {"text": SYSTEM, "sampling_params": {"max_new_tokens": 3}}
    await post(http, server.url + "/generate", body)
    await post(http, server.url + "/generate", body)
    async with http.get(server.url + "/metrics") as r:
        after = await r.text()
    assert metric_value(after, "sglang:num_requests_total") == 2
    assert metric_value(after, "sglang:prompt_tokens_total") == 800
    assert metric_value(after, "sglang:cached_tokens_total") == 399  # the repeat computes its last token
    assert metric_value(after, "sglang:generation_tokens_total") == 6
    assert metric_value(after, "sglang:time_to_first_token_seconds_count") == 2
    assert metric_value(after, "sglang:inter_token_latency_seconds_count") == 4
    assert metric_value(after, "sglang:cache_hit_rate") == pytest.approx(399 / 800)


async def test_two_servers_in_one_process_keep_separate_metrics(http):
    cfg = EmulatorConfig(**FAST)  # type: ignore[arg-type]
    a = await start_emulator(cfg)
    b = await start_emulator(cfg)
    try:
        assert a.port != b.port
        await post(http, a.url + "/generate", {"text": "only on a", "sampling_params": {"max_new_tokens": 1}})
        async with http.get(b.url + "/metrics") as r:
            assert metric_value(await r.text(), "sglang:num_requests_total") == 0
    finally:
        await a.stop()
        await b.stop()


# -- bad input -----------------------------------------------------------------------------------------


BAD_REQUESTS = [
    ("/generate", b"{not json", "body"),
    ("/generate", b"", "body"),
    ("/generate", b"[1, 2]", "body"),
    ("/generate", b'{"sampling_params": {}}', "text"),
    ("/generate", b'{"text": "a", "input_ids": [1]}', "text"),
    ("/generate", b'{"text": 5}', "text"),
    ("/generate", b'{"input_ids": ["a"]}', "input_ids"),
    ("/generate", b'{"input_ids": [-1]}', "input_ids"),
    ("/generate", b'{"input_ids": []}', "input_ids"),
    ("/generate", b'{"text": "   "}', "text"),
    (
        "/generate",
        b'{"text": "a", "sampling_params": {"max_new_tokens": -1}}',
        "sampling_params.max_new_tokens",
    ),
    (
        "/generate",
        b'{"text": "a", "sampling_params": {"max_new_tokens": 10000000}}',
        "sampling_params.max_new_tokens",
    ),
    (
        "/generate",
        b'{"text": "a", "sampling_params": {"max_new_tokens": "many"}}',
        "sampling_params.max_new_tokens",
    ),
    ("/generate", b'{"text": "a", "sampling_params": 3}', "sampling_params"),
    ("/generate", b'{"text": "a", "stream": "maybe"}', "stream"),  # "yes" is true to SGLang's pydantic
    ("/generate", b'{"text": "a", "rid": 7}', "rid"),
    ("/v1/completions", b'{"max_tokens": 3}', "prompt"),
    ("/v1/completions", b'{"prompt": {"a": 1}}', "prompt"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": -5}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "n": 3}', "n"),
    ("/v1/completions", b'{"prompt": "a", "stream_options": 1}', "stream_options"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}',
        "max_tokens",
    ),
]


@pytest.mark.parametrize("path,raw,param", BAD_REQUESTS)
async def test_bad_input_gets_400_naming_the_field_and_the_server_keeps_serving(
    server: EmulatorServer, http, path: str, raw: bytes, param: str
):
    async with http.post(server.url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["param"] == param and error["message"]
    async with http.get(server.url + "/health") as r:
        assert r.status == 200
    status, _ = await post(
        http, server.url + "/generate", {"text": "still fine", "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 200


async def test_oversized_prompts_and_bodies_are_refused_with_a_reason(http):
    cfg = EmulatorConfig(time_scale=200.0, cache_tokens=1_000, max_prompt_tokens=100, max_body_bytes=20_000)
    async with EmulatorServer(cfg) as s:
        status, err = await post(http, s.url + "/generate", {"text": " ".join(["w"] * 101)})
        assert status == 400 and "at most 100" in err["error"]["message"] and err["error"]["param"] == "text"
        status, err = await post(
            http, s.url + "/generate", {"text": "w w", "sampling_params": {"max_new_tokens": 999}}
        )
        assert status == 400 and "KV cache capacity" in err["error"]["message"]
        async with http.post(s.url + "/generate", data=b"x" * 30_000) as r:
            assert r.status == 413 and (await r.json())["error"]["param"] == "body"
        async with http.get(s.url + "/nope") as r:
            assert r.status == 404
        status, ok = await post(
            http, s.url + "/generate", {"text": "w w", "sampling_params": {"max_new_tokens": 2}}
        )
        assert status == 200 and ok["meta_info"]["completion_tokens"] == 2


# -- flush and aborts ----------------------------------------------------------------------------------


async def test_flush_cache_refused_while_busy_and_a_dropped_stream_aborts_its_request(http):
    # Real time (scale 1): 40 decode steps of 20 ms keep the request running for ~0.8 s.
    async with EmulatorServer(EmulatorConfig(cache_tokens=20_000)) as s:
        body = {"text": SYSTEM, "sampling_params": {"max_new_tokens": 40}, "stream": True}
        async with http.post(s.url + "/generate", json=body) as stream:
            await stream.content.readuntil(b"\n\n")  # first token: the request is running
            async with http.post(s.url + "/flush_cache") as r:
                assert r.status == 400 and "running" in await r.text()
            async with http.get(s.url + "/get_load") as r:
                assert (await r.json())[0]["num_reqs"] == 1
            stream.close()  # client goes away mid-stream
        for _ in range(200):
            async with http.get(s.url + "/get_load") as r:
                if (await r.json())[0]["num_reqs"] == 0:
                    break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the abandoned request was never aborted")
        async with http.get(s.url + "/flush_cache") as r:
            assert r.status == 200
        status, after = await post(
            http, s.url + "/generate", {"text": SYSTEM, "sampling_params": {"max_new_tokens": 0}}
        )
        assert status == 200 and after["meta_info"]["cached_tokens"] == 0


async def test_stopping_the_server_ends_in_flight_streams(http):
    s = await start_emulator(EmulatorConfig(cache_tokens=20_000))
    body = {"text": "long answer please", "sampling_params": {"max_new_tokens": 500}, "stream": True}
    async with http.post(s.url + "/generate", json=body) as stream:
        await stream.content.readuntil(b"\n\n")
        await s.stop()
        rest = (await stream.read()).decode()
    assert "shutting down" in rest and rest.rstrip().endswith("data: [DONE]")


async def test_a_start_that_fails_leaves_no_engine_running(monkeypatch) -> None:
    # Whatever fails after the engine's scheduler started, start() stops it before raising.
    async with EmulatorServer(EmulatorConfig(**FAST)) as taken:  # type: ignore[arg-type]
        port_taken = EmulatorServer(EmulatorConfig(**FAST), port=taken.port)  # type: ignore[arg-type]
        with pytest.raises(OSError):
            await port_taken.start()
        assert not port_taken.engine.running
    monkeypatch.setenv(BODY_TIMEOUT_ENV, "-1")
    bad_limits = EmulatorServer(EmulatorConfig(**FAST))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=BODY_TIMEOUT_ENV):
        await bad_limits.start()
    assert not bad_limits.engine.running
