"""Request parsing and response shapes of SGLang's native and OpenAI-compatible APIs (pure).

Parsers turn a decoded JSON body into plain calls or raise :class:`BadRequest` naming the field;
builders turn :class:`~prefixfleet.emulator.runner.Snapshot` values into the JSON SGLang returns.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError

from prefixfleet.sglang_fields import (
    AS_BOOL,
    AS_FLOAT,
    AS_INT,
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    DEFAULT_GENERATE_MAX_NEW_TOKENS,
    FieldError,
    cache_salts,
    generated_tokens,
    shown,
)
from prefixfleet.tokenizer import render_chat, tokenize

from .runner import Snapshot

MAX_BATCH = 256


class BadRequest(ValueError):
    """A client error: answered with ``status`` and a JSON error naming ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass(frozen=True, slots=True)
class Limits:
    max_prompt_tokens: int
    max_new_tokens: int
    vocab_size: int | None = None  # None: any id in [0, 2**32) (the shared tokenizer's are 31-bit)


@dataclass(frozen=True, slots=True)
class Call:
    """A parsed request: one or more prompts to run, and how to answer."""

    prompts: tuple[array, ...]
    max_new_tokens: tuple[int, ...]
    rids: tuple[str | None, ...]
    stream: bool
    batch: bool  # answer with a list (SGLang) / several choices (OpenAI)
    include_usage: bool = False
    model: str | None = None
    # tenant isolation (cache_salt): a separate prefix cache per salt; one per prompt, () for none
    cache_salts: tuple[str | None, ...] = ()
    # the LoRA adapter the request names (vLLM face: its model is an adapter's name); None: the base
    adapter: str | None = None
    # the SGLang face's adapters, one per prompt (a batch's lora_path may name one each); () for none
    adapters: tuple[str | None, ...] = ()

    def cache_salt(self, index: int) -> str | None:
        return self.cache_salts[index] if self.cache_salts else None

    def namespace(self, index: int) -> object:
        """The radix namespace prompt ``index`` is cached under: its salt, and the adapter when one
        is named (vLLM's block hashes take the LoRA name and the salt as extra keys, SGLang's radix
        cache the adapter and the salt: a prompt cached under one adapter is a miss under another
        and under the base model)."""
        salt = self.cache_salt(index)
        adapter = self.adapters[index] if self.adapters else self.adapter
        return salt if adapter is None else (adapter, salt)


def error_body(message: str, param: str | None, status: int) -> dict[str, object]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}, "object": "error"}


# -- field validation ------------------------------------------------------------------------------


# Fields are coerced, and refused, as SGLang's lax pydantic request models do (prefixfleet.sglang_fields).
_AS_STOP: TypeAdapter[str | list[str]] = TypeAdapter(str | list[str])
_AS_TOKEN_IDS: TypeAdapter[list[int]] = TypeAdapter(list[int])

_T = TypeVar("_T")


def _lax(adapter: TypeAdapter[_T], value: object, name: str, kind: str) -> _T:
    """``value`` coerced as SGLang's pydantic models coerce it, or a 400 naming ``name``."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"]
        raise BadRequest(f"{name} must be {kind}, got {shown(value)} ({reason})", name) from None


def json_object(body: object) -> Mapping[str, object]:
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object", "body")
    return body


def _bool(body: Mapping[str, object], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    return _lax(AS_BOOL, value, name, "a boolean")


def _int(value: object, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise BadRequest(f"{name} must be an integer", name)
    if value < 0:
        raise BadRequest(f"{name} must not be negative, got {value}", name)
    if value > limit:
        raise BadRequest(f"{name} must be at most {limit}, got {value}", name)
    return value


def _token_ids(value: object, name: str) -> array:
    if not isinstance(value, list):
        raise BadRequest(f"{name} must be a list of token ids", name)
    try:  # List[int] in SGLang's models: 2.0 and "2" are token 2, 2.5 and "x" are refused
        ids = _AS_TOKEN_IDS.validate_python(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        i = error["loc"][0]
        raise BadRequest(
            f"{name}[{i}] must be an integer token id, got {shown(value[i])} ({error['msg']})", name
        ) from None
    for i, t in enumerate(ids):
        if not 0 <= t < 2**32:
            raise BadRequest(f"{name}[{i}] must be an integer token id in [0, 2**32)", name)
    return array("I", ids)


def _check_vocab(prompts: list[array], name: str, limits: Limits) -> None:
    """A client's token ids must be below the vocabulary size, as SGLang's TokenizerManager checks
    (``_validate_input_ids_in_vocab``): pre-warm tests prove no made-up ids reach an engine."""
    vocab = limits.vocab_size
    if vocab is None:
        return
    for p in prompts:
        if p and max(p) >= vocab:
            raise BadRequest(
                f"The input_ids {name} contains values greater than the vocab size ({vocab}): {max(p)}", name
            )


def _check_prompt(tokens: array, name: str, limits: Limits) -> array:
    if len(tokens) == 0:
        raise BadRequest(f"{name} must not be empty", name)
    if len(tokens) > limits.max_prompt_tokens:
        raise BadRequest(
            f"{name} is {len(tokens)} tokens long; this engine accepts at most {limits.max_prompt_tokens}",
            name,
        )
    return tokens


# Sampling parameters the emulator does not model but SGLang checks (SamplingParams.verify): a
# client that the emulator answered would get a 400 from SGLang for these. (low, high, low open)
_SAMPLING_RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, math.inf, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "presence_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, 2.0, True),
}


_GREEDY_TEMPERATURE = 1e-6  # SGLang's _SAMPLING_EPS: a temperature in [0, it) samples greedily


def _is_number(value: object) -> bool:
    # /generate's sampling_params reach SamplingParams unvalidated: any Python number compares
    # (a bool too, as SGLang's comparisons take it); anything else fails there with a TypeError.
    return isinstance(value, int | float)


def _check_sampling(params: Mapping[str, object], prefix: str, lax: bool) -> None:
    """Types and ranges of the sampling parameters SGLang refuses; their values change nothing here.

    ``lax``: the OpenAI bodies, whose fields SGLang's pydantic models coerce ("0.7" is 0.7, 50.0 is
    top_k 50, "yes" is true). Otherwise /generate's ``sampling_params``, a plain dict SGLang never
    type-checks: numbers are compared as they are, ``ignore_eos`` is only tested for truth.
    """
    values: dict[str, float] = {}
    for name, (low, high, open_low) in _SAMPLING_RANGES.items():
        value = params.get(name)
        if value is None:
            continue
        if lax:
            value = _lax(AS_FLOAT, value, prefix + name, "a number")
        elif not _is_number(value):
            raise BadRequest(f"{prefix}{name} must be a number, got {shown(value)}", prefix + name)
        if not math.isfinite(value):
            raise BadRequest(f"{prefix}{name} must be a finite number, got {value}", prefix + name)
        if value < low or (open_low and value == low) or value > high:
            bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise BadRequest(f"{prefix}{name} must be in {bounds}, got {value}", prefix + name)
        values[name] = value
    top_k = params.get("top_k")
    if top_k is not None and lax:
        top_k = _lax(AS_INT, top_k, prefix + "top_k", "an integer")
    # temperature 0 is greedy: SGLang sets top_k to 1 before its check, so any top_k passes then
    greedy = 0 <= values.get("temperature", 1.0) < _GREEDY_TEMPERATURE
    if top_k is not None and not greedy and (not _is_number(top_k) or (top_k < 1 and top_k != -1)):
        raise BadRequest(f"{prefix}top_k must be -1 (off) or a positive integer", prefix + "top_k")
    stop = params.get("stop")
    if stop is not None:
        if lax:
            _lax(_AS_STOP, stop, prefix + "stop", "a string or a list of strings")
        elif not (
            isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
        ):
            raise BadRequest(f"{prefix}stop must be a string or a list of strings", prefix + "stop")
    ignore_eos = params.get("ignore_eos")
    if ignore_eos is not None and lax:
        _lax(AS_BOOL, ignore_eos, prefix + "ignore_eos", "a boolean")


# Fields SGLang's request models type without Optional (CompletionRequest, ChatCompletionRequest,
# GenerateReqInput): an explicit null fails their validation, so it is a 400 here too. Only the
# fields the emulator reads or checks; a null elsewhere (an Optional field) means "absent".
_NOT_NULL_COMPLETION = (
    "model", "echo", "max_tokens", "n", "stream", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos",
)  # fmt: skip
_NOT_NULL_CHAT = ("model", "n", "stream", "frequency_penalty", "presence_penalty", "ignore_eos")
_NOT_NULL_GENERATE = ("stream",)


def _refuse_nulls(body: Mapping[str, object], names: tuple[str, ...]) -> None:
    for name in names:
        if name in body and body[name] is None:
            raise BadRequest(f"{name} must not be null", name)


def _cache_salts(body: Mapping[str, object], prompts: int, batch: bool) -> tuple[str | None, ...]:
    """One salt per prompt, as SGLang reads ``cache_salt`` (see
    :func:`prefixfleet.sglang_fields.cache_salts`)."""
    try:
        return cache_salts(body.get("cache_salt"), prompts, batch)
    except FieldError as exc:
        raise BadRequest(str(exc), "cache_salt") from None


def _max_new_tokens(value: object, name: str, limit: int) -> int:
    """How many tokens a ``sampling_params.max_new_tokens`` generates, as SGLang reads it
    (:func:`~prefixfleet.sglang_fields.generated_tokens`: 2.5 generates 3), at most ``limit``."""
    try:
        number = generated_tokens(value, name)
    except FieldError as exc:
        raise BadRequest(str(exc), name) from None
    if number > limit:
        raise BadRequest(f"{name} must be at most {limit}, got {value}", name)
    return number


def _stream_usage(body: Mapping[str, object]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, Mapping):
        raise BadRequest("stream_options must be an object", "stream_options")
    value = options.get("include_usage")
    if value is None:
        return False
    return _lax(AS_BOOL, value, "stream_options.include_usage", "a boolean")


# -- SGLang native /generate -------------------------------------------------------------------


def parse_generate(body: object, limits: Limits) -> Call:
    body = json_object(body)
    _refuse_nulls(body, _NOT_NULL_GENERATE)
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("exactly one of text or input_ids must be given", "text")
    prompts: list[array]
    if text is not None:
        if isinstance(text, str):
            prompts, batch = [tokenize(text)], False
        elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            prompts, batch = [tokenize(t) for t in text], True
        else:
            raise BadRequest("text must be a string or a non-empty list of strings", "text")
        name = "text"
    else:
        if isinstance(input_ids, list) and input_ids and all(isinstance(x, list) for x in input_ids):
            prompts = [_token_ids(x, "input_ids") for x in input_ids]
            batch = True
        else:
            prompts, batch = [_token_ids(input_ids, "input_ids")], False
        name = "input_ids"
        _check_vocab(prompts, name, limits)
    if len(prompts) > MAX_BATCH:
        raise BadRequest(f"{name} holds {len(prompts)} prompts; at most {MAX_BATCH} per request", name)
    for p in prompts:
        _check_prompt(p, name, limits)

    params = body.get("sampling_params", {})
    if params is None:
        params = {}
    if isinstance(params, list):
        if not batch or len(params) != len(prompts):
            raise BadRequest("a list of sampling_params needs one entry per prompt", "sampling_params")
        param_list = params
    else:
        param_list = [params] * len(prompts)
    max_new: list[int] = []
    for sp in param_list:
        if not isinstance(sp, Mapping):
            raise BadRequest("sampling_params must be an object", "sampling_params")
        _check_sampling(sp, "sampling_params.", lax=False)
        value = sp.get("max_new_tokens", DEFAULT_GENERATE_MAX_NEW_TOKENS)
        if value is None:
            value = DEFAULT_GENERATE_MAX_NEW_TOKENS
        max_new.append(_max_new_tokens(value, "sampling_params.max_new_tokens", limits.max_new_tokens))

    rid = body.get("rid")
    if rid is None:
        rids: list[str | None] = [None] * len(prompts)
    elif isinstance(rid, str) and not batch:
        rids = [rid]
    elif (
        isinstance(rid, list) and batch and len(rid) == len(prompts) and all(isinstance(r, str) for r in rid)
    ):
        rids = list(rid)
    else:
        raise BadRequest("rid must be a string (or a list of strings, one per prompt)", "rid")
    if len({r for r in rids if r is not None}) != sum(r is not None for r in rids):
        raise BadRequest("rid values must be unique", "rid")
    stream = _bool(body, "stream")
    salts = _cache_salts(body, len(prompts), batch)
    return Call(tuple(prompts), tuple(max_new), tuple(rids), stream, batch, cache_salts=salts)


def generate_object(snap: Snapshot, text: str, index: int | None = None) -> dict[str, object]:
    meta: dict[str, object] = {
        "id": snap.rid,
        "prompt_tokens": snap.prompt_tokens,
        "completion_tokens": snap.completion_tokens,
        "cached_tokens": snap.cached_tokens,
        "finish_reason": {"type": "length", "length": snap.completion_tokens} if snap.finished else None,
        "e2e_latency": round(snap.e2e_latency, 6),
    }
    out: dict[str, object] = {"text": text, "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out


# -- OpenAI-compatible ---------------------------------------------------------------------------


def _max_tokens(
    body: Mapping[str, object], default: int, limits: Limits, names: tuple[str, ...] = ("max_tokens",)
) -> int:
    for name in names:
        value = body.get(name)
        if value is not None:
            return _int(_lax(AS_INT, value, name, "an integer"), name, limits.max_new_tokens)
    return default


def _common_openai(body: Mapping[str, object]) -> tuple[bool, bool, str | None]:
    n = body.get("n")
    if n is not None and _lax(AS_INT, n, "n", "an integer") != 1:
        raise BadRequest("only n=1 is supported", "n")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    _check_sampling(body, "", lax=True)
    stream = _bool(body, "stream")
    return stream, _stream_usage(body), model


def parse_completion(body: object, limits: Limits) -> Call:
    body = json_object(body)
    _refuse_nulls(body, _NOT_NULL_COMPLETION)
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("prompt is required", "prompt")
    if isinstance(prompt, str):
        prompts, batch = [tokenize(prompt)], False
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts, batch = [tokenize(p) for p in prompt], True
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts, batch = [_token_ids(p, "prompt") for p in prompt], True
        _check_vocab(prompts, "prompt", limits)
    elif isinstance(prompt, list) and prompt:
        prompts, batch = [_token_ids(prompt, "prompt")], False
        _check_vocab(prompts, "prompt", limits)
    else:
        raise BadRequest("prompt must be a string, a list of strings or a list of token ids", "prompt")
    if len(prompts) > MAX_BATCH:
        raise BadRequest(f"prompt holds {len(prompts)} prompts; at most {MAX_BATCH} per request", "prompt")
    for p in prompts:
        _check_prompt(p, "prompt", limits)
    if _bool(body, "echo"):
        raise BadRequest("echo is not supported by the emulator", "echo")
    stream, usage, model = _common_openai(body)
    # SGLang's CompletionRequest validates max_tokens positive (its chat request has no such rule)
    given = body.get("max_tokens")
    if given is not None and _lax(AS_INT, given, "max_tokens", "an integer") <= 0:
        raise BadRequest(f"max_tokens must be positive, got {given}", "max_tokens")
    # max_tokens only: SGLang's CompletionRequest has no max_completion_tokens (chat's field) and
    # ignores it, unread and unchecked
    max_new = _max_tokens(body, DEFAULT_COMPLETION_MAX_TOKENS, limits)
    n = len(prompts)
    salts = _cache_salts(body, n, batch)
    return Call(tuple(prompts), (max_new,) * n, (None,) * n, stream, batch, usage, model, salts)


# SGLang's chat message roles (its OpenAI protocol models): a message is either its generic param,
# whose role validator lower-cases the role before checking it ("System" is "system"), or its user
# param, typed Literal["user"] and so exact ("User" is refused). Another role is a 400 there too.
GENERIC_CHAT_ROLES = ("system", "developer", "assistant", "tool", "function", "latest_reminder")
CHAT_ROLES = (*GENERIC_CHAT_ROLES, "user")


# The content part models of SGLang's ChatCompletionMessageContentPart union; a part of another type
# (OpenAI's "input_audio", "refusal", "file") matches none of them, so SGLang answers 400. Thinking
# parts are valid in assistant messages only (its model validators say so).
CONTENT_PART_TYPES = (
    "text",
    "image_url",
    "video_url",
    "audio_url",
    "tool_reference",
    "thinking",
    "reasoning",
)
_ASSISTANT_ONLY_PARTS = ("thinking", "reasoning")


def _check_messages(messages: list[object]) -> None:
    """Refuse what SGLang's request models refuse and the shared chat template (render_chat, which
    also lower-cases roles as SGLang does) would skip or stringify: an unknown role, a content part
    that is no object with one of SGLang's part types, a text part whose ``text`` is no string
    (``{"type": "text", "text": 5}`` was prefilled as "5")."""
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            continue  # render_chat names it
        role = msg.get("role")
        if isinstance(role, str) and role != "user" and role.lower() not in GENERIC_CHAT_ROLES:
            raise BadRequest(
                f"messages[{i}].role must be 'user' or one of {', '.join(GENERIC_CHAT_ROLES)} "
                f"(case-insensitive), got {role!r}",
                "messages",
            )
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise BadRequest(f"{where} must be an object with a string type", "messages")
            if part["type"] not in CONTENT_PART_TYPES:
                raise BadRequest(
                    f"{where}.type must be one of {', '.join(CONTENT_PART_TYPES)}, got {shown(part['type'])}",
                    "messages",
                )
            if part["type"] in _ASSISTANT_ONLY_PARTS and msg.get("role") != "assistant":
                raise BadRequest(
                    f"{where}: {part['type']} parts are only valid in assistant messages", "messages"
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.text must be a string", "messages")


def parse_chat(body: object, limits: Limits) -> Call:
    body = json_object(body)
    _refuse_nulls(body, _NOT_NULL_CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    _check_messages(messages)
    try:
        text = render_chat(messages)
    except ValueError as exc:
        raise BadRequest(str(exc), "messages") from None
    prompt = _check_prompt(tokenize(text), "messages", limits)
    stream, usage, model = _common_openai(body)
    max_new = _max_tokens(body, DEFAULT_CHAT_MAX_TOKENS, limits, ("max_completion_tokens", "max_tokens"))
    return Call((prompt,), (max_new,), (None,), stream, False, usage, model, _cache_salts(body, 1, False))


def usage_object(snaps: list[Snapshot], *, cache_report: bool) -> dict[str, object]:
    """OpenAI usage as SGLang builds it (usage_processor.py): ``prompt_tokens_details`` holds the
    cached tokens only when the engine runs with --enable-cache-report (``cache_report``), and
    then only when there are any (SGLang: ``_details_if_cached``); ``null`` otherwise. A client
    (the sidecar too) must read it as optional."""
    prompt = sum(s.prompt_tokens for s in snaps)
    completion = sum(s.completion_tokens for s in snaps)
    cached = sum(s.cached_tokens for s in snaps)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached} if cache_report and cached > 0 else None,
    }


def completion_response(
    response_id: str, model: str, created: int, snaps: list[Snapshot], texts: list[str], *, cache_report: bool
) -> dict[str, object]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "text": t, "logprobs": None, "finish_reason": s.finish_reason}
            for i, (s, t) in enumerate(zip(snaps, texts, strict=True))
        ],
        "usage": usage_object(snaps, cache_report=cache_report),
    }


def completion_chunk(
    response_id: str, model: str, created: int, index: int, delta: str, finish_reason: str | None
) -> dict[str, object]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def chat_response(
    response_id: str, model: str, created: int, snap: Snapshot, text: str, *, cache_report: bool
) -> dict[str, object]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": snap.finish_reason,
            }
        ],
        "usage": usage_object([snap], cache_report=cache_report),
    }


def chat_chunk(
    response_id: str, model: str, created: int, delta: Mapping[str, object], finish_reason: str | None
) -> dict[str, object]:
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(
    response_id: str, model: str, created: int, obj: str, snaps: list[Snapshot], *, cache_report: bool
) -> dict[str, object]:
    return {
        "id": response_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_object(snaps, cache_report=cache_report),
    }


def unix_now() -> int:
    return int(time.time())
