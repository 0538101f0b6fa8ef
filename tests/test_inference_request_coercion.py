"""The gateway and the sidecar read a request's fields as the engine (SGLang's pydantic request
models, lax mode) does: what the engine serves they never refuse, what it refuses they refuse first.
And every hop renders a chat the same way, so the tokens the router matches are the engine's."""

from __future__ import annotations

import json

import pytest

from prefixfleet.emulator.protocol import BadRequest as EngineBadRequest
from prefixfleet.emulator.protocol import Limits, parse_chat, parse_completion, parse_generate
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.requests import BadRequest, inference_request
from prefixfleet.tokenizer import render_chat, tokenize

CHAT, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
USER = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("path", "body", "stream", "max_new"),
    [
        (CHAT, {"messages": USER, "max_tokens": "5"}, False, 5),
        (CHAT, {"messages": USER, "max_tokens": 5.0, "stream": "true"}, True, 5),
        (CHAT, {"messages": USER, "max_completion_tokens": "7", "stream": "yes"}, True, 7),
        (COMPLETIONS, {"prompt": "x", "max_tokens": " 4 ", "stream": 0}, False, 4),
        (GENERATE, {"text": "x", "stream": "on", "sampling_params": {"max_new_tokens": 3}}, True, 3),
    ],
)
def test_fields_the_engine_coerces_are_read_as_it_reads_them(
    path: str, body: dict[str, object], stream: bool, max_new: int
) -> None:
    request = inference_request(path, body)
    assert (request.stream, request.max_new_tokens) == (stream, max_new)


def test_token_ids_the_engine_coerces_route_as_the_ids_it_computes() -> None:
    loose = inference_request(GENERATE, {"input_ids": [1, 2.0, "3", True]})
    assert loose.token_bytes == as_token_bytes([1, 2, 3, 1])
    batch = inference_request(COMPLETIONS, {"prompt": [[7.0, 8]]})
    assert batch.token_bytes == as_token_bytes([7, 8])


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": USER, "max_tokens": 5.5}, "max_tokens"),
        (CHAT, {"messages": USER, "max_tokens": "five"}, "max_tokens"),
        (CHAT, {"messages": USER, "max_tokens": "-1"}, "max_tokens"),
        (CHAT, {"messages": USER, "stream": "maybe"}, "stream"),
        (CHAT, {"messages": USER, "stream": 2}, "stream"),
        (GENERATE, {"input_ids": [1, 2.5]}, "input_ids"),
        (GENERATE, {"input_ids": [1, "x"]}, "input_ids"),
        (GENERATE, {"input_ids": [2**32]}, "input_ids"),
        # sampling_params is a plain dict in SGLang, compared as given: a string there is its 500
        (
            GENERATE,
            {"text": "x", "sampling_params": {"max_new_tokens": "3"}},
            "sampling_params.max_new_tokens",
        ),
    ],
)
def test_what_the_engine_refuses_is_refused_naming_the_field(
    path: str, body: dict[str, object], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        inference_request(path, body)
    assert refused.value.status == 400 and refused.value.param == param


def test_a_role_in_another_case_renders_the_same_prompt_on_every_hop() -> None:
    mixed = [{"role": "System", "content": "be brief"}, {"role": "user", "content": "hi"},
             {"role": "Assistant", "content": None}, {"role": "tool", "content": None}]  # fmt: skip
    lower = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": ""}, {"role": "tool", "content": ""}]  # fmt: skip
    assert render_chat(mixed) == render_chat(lower)
    gateway = inference_request(CHAT, {"messages": mixed})
    engine = parse_chat(
        json.loads(json.dumps({"messages": mixed})), Limits(max_prompt_tokens=100_000, max_new_tokens=1000)
    )
    assert gateway.token_bytes == as_token_bytes(tokenize(render_chat(lower)))
    assert list(engine.prompts[0]) == list(tokenize(render_chat(lower)))


# -- a batch's per-prompt fields: judged as the engine judges them, routed by the first prompt's ------

ENGINE_LIMITS = Limits(max_prompt_tokens=100_000, max_new_tokens=1000)
ENGINE_PARSERS = {GENERATE: parse_generate, COMPLETIONS: parse_completion, CHAT: parse_chat}

# Bodies SGLang serves that the router refused before: a batch with one salt per prompt, and
# /generate's max_new_tokens read by SGLang's own rule (2.5 generates 3, 3.0 generates 3), also from
# a per-prompt list of sampling_params.
SERVED = [
    (GENERATE, {"text": ["a b", "c"], "cache_salt": ["t1", "t2"]}, "t1", None),
    (GENERATE, {"input_ids": [[1, 2], [3]], "cache_salt": ["", "t2"]}, None, None),
    (COMPLETIONS, {"prompt": ["a", "b", "c"], "cache_salt": ["x", "y", "z"], "max_tokens": 2}, "x", 2),
    (COMPLETIONS, {"prompt": [[5, 6], [7]], "cache_salt": ["q", ""]}, "q", None),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": 2.5}}, None, 3),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": 0.5}}, None, 1),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": 3.0}}, None, 3),
    (GENERATE, {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 9}]},
     None, 4),
    (GENERATE, {"text": ["a", "b"], "cache_salt": "s", "sampling_params": [{}, {"max_new_tokens": 9}]},
     "s", None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "salt", "max_new"), SERVED)
def test_a_batch_routes_with_its_first_prompts_salt_and_length_as_the_engine_runs_it(
    path: str, body: dict[str, object], salt: str | None, max_new: int | None
) -> None:
    routed = inference_request(path, body)
    engine = ENGINE_PARSERS[path](json.loads(json.dumps(body)), ENGINE_LIMITS)
    # the router's namespace is the one the engine caches the first prompt's tokens under
    assert routed.tenant_salt == engine.cache_salt(0) == salt
    assert routed.token_bytes == as_token_bytes(engine.prompts[0])
    if max_new is not None:  # given: the first prompt's, as many as the engine generates for it
        assert routed.max_new_tokens == engine.max_new_tokens[0] == max_new


MAX_NEW = "sampling_params.max_new_tokens"
REFUSED_BY_BOTH = [
    (COMPLETIONS, {"prompt": "a", "cache_salt": ["x"]}, "cache_salt"),  # a list for a single prompt
    (COMPLETIONS, {"prompt": ["a", "b"], "cache_salt": ["x"]}, "cache_salt"),  # one short
    (GENERATE, {"text": ["a", "b"], "cache_salt": ["x", 5]}, "cache_salt"),
    (GENERATE, {"text": ["a", "b"], "cache_salt": {"x": 1}}, "cache_salt"),
    (CHAT, {"messages": USER, "cache_salt": ["x"]}, "cache_salt"),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": float("nan")}}, MAX_NEW),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": True}}, MAX_NEW),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": -0.5}}, MAX_NEW),
    (GENERATE, {"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": "9"}]}, MAX_NEW),
    (GENERATE, {"text": "a", "sampling_params": [{}]}, "sampling_params"),  # a list for a single prompt
    (GENERATE, {"text": ["a", "b"], "sampling_params": [{}, 5]}, "sampling_params"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param"), REFUSED_BY_BOTH)
def test_a_batch_field_the_engine_refuses_the_router_refuses_naming_it(
    path: str, body: dict[str, object], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        inference_request(path, body)
    assert refused.value.status == 400 and refused.value.param == param
    with pytest.raises(EngineBadRequest) as engine_refused:
        ENGINE_PARSERS[path](body, ENGINE_LIMITS)
    assert engine_refused.value.param == param


def test_a_lone_surrogate_in_any_salt_of_a_batch_is_refused_like_a_single_salt() -> None:
    with pytest.raises(BadRequest) as refused:
        inference_request(COMPLETIONS, {"prompt": ["a", "b"], "cache_salt": ["ok", "\ud800"]})
    assert refused.value.param == "cache_salt" and "surrogate" in str(refused.value)


NO_LIMIT = [
    (GENERATE, {"text": "a"}),
    (GENERATE, {"text": "a", "sampling_params": {"max_new_tokens": None}}),
    (GENERATE, {"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": 9}]}),
    (COMPLETIONS, {"prompt": "a"}),
    (CHAT, {"messages": USER}),
    (CHAT, {"messages": USER, "max_tokens": None}),
]


@pytest.mark.parametrize(("path", "body"), NO_LIMIT)
def test_a_request_naming_no_length_is_estimated_at_what_the_engine_generates(
    path: str, body: dict[str, object]
) -> None:
    """The router's decode estimate for a request with no max_new_tokens/max_tokens is the engine's
    default for that endpoint (128 on /generate and chat, 16 on completions), not one figure for all."""
    routed = inference_request(path, body)
    engine = ENGINE_PARSERS[path](json.loads(json.dumps(body)), ENGINE_LIMITS)
    assert routed.max_new_tokens == engine.max_new_tokens[0]
    assert routed.max_new_tokens == (16 if path == COMPLETIONS else 128)
