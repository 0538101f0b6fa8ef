"""Request parsing and response shapes of vLLM's OpenAI-compatible server (pure; no I/O).

Checked against the stored source of vllm-project/vllm (docs/emulator.md, "vLLM mode"):
``vllm/entrypoints/openai/engine/protocol.py`` (ErrorInfo/ErrorResponse, ModelCard, ModelPermission,
UsageInfo, PromptTokenUsageInfo, StreamOptions, CompletionRequest),
``vllm/entrypoints/openai/engine/serving.py`` (create_error_response, _check_model, _validate_input),
``vllm/entrypoints/openai/completion/serving.py`` (usage, prompt_tokens_details, the usage chunk),
``vllm/entrypoints/serve/tokenize/protocol.py`` and ``vllm/sampling_params.py`` (_verify_args).

Request bodies are pydantic models validated in lax mode as vLLM's are (``"0.7"`` is a float, ``"16"``
an int); a body they refuse is vLLM's validation answer: 400, type ``"Bad Request"``. What the
serving layer refuses afterwards (sampling parameters, lengths) is type ``"BadRequestError"``.
"""

from __future__ import annotations

import json
import math
import uuid
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

# DEFAULT_CHAT_MAX_TOKENS: vLLM generates until EOS or max_model_len - prompt when a chat names no
# max_tokens; the emulator has no EOS, so it stops where its SGLang face does
from prefixfleet.sglang_fields import DEFAULT_CHAT_MAX_TOKENS
from prefixfleet.tokenizer import render_chat, tokenize

from .protocol import MAX_BATCH, BadRequest, Call
from .runner import Snapshot

# vLLM's token ids must be below the vocabulary size; the shared tokenizer's ids are 31-bit CRCs
VOCAB_SIZE = 2**31
DEFAULT_COMPLETION_MAX_TOKENS = 16  # CompletionRequest.max_tokens


class VllmBadRequest(BadRequest):
    """A client error answered in vLLM's shape with vLLM's ``type`` (BadRequestError, NotFoundError,
    "Bad Request" for bodies the request models refuse)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str | None = None):
        super().__init__(message, param, status)
        self.kind = kind


def error_type(status: int) -> str:
    """vLLM's ``type`` for an error raised by its serving layer (create_error_response)."""
    return {404: "NotFoundError", 501: "NotImplementedError"}.get(
        status, "InternalServerError" if status >= 500 else "BadRequestError"
    )


def error_body(message: str, param: str | None, status: int, kind: str | None = None) -> dict[str, object]:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}``, code the HTTP status."""
    return {"error": {"message": message, "type": kind or error_type(status), "param": param, "code": status}}


# -- request models (the fields the emulator reads or checks; others are accepted and ignored) -------


class _Lax(BaseModel):
    # vLLM's OpenAIBaseModel: extra fields allowed (and ignored); lax coercion
    model_config = ConfigDict(extra="allow")


class _Problem(ValueError):
    """Raised in a validator: vLLM's VLLMValidationError, which names the parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(_Lax):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class SamplingBody(_Lax):
    """The fields /v1/completions and /v1/chat/completions share (vLLM's sampling parameters)."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = []
    ignore_eos: bool = False
    min_tokens: int = 0
    cache_salt: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("stream_options") and not data.get("stream"):
            raise _Problem("Stream options can only be defined when `stream=True`.", "stream_options")
        return data

    @model_validator(mode="before")
    @classmethod
    def _cache_salt(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("cache_salt") is not None:
            salt = data["cache_salt"]
            if not isinstance(salt, str) or not salt:
                raise _Problem("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        return data


class CompletionBody(SamplingBody):
    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    echo: bool | None = False
    max_tokens: int | None = DEFAULT_COMPLETION_MAX_TOKENS

    @model_validator(mode="before")
    @classmethod
    def _prompt_given(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            prompt = data.get("prompt")
            if prompt is None or prompt == "":
                raise _Problem("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        return data


class ChatBody(SamplingBody):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


class TokenizeBody(_Lax):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="before")
    @classmethod
    def _one_input(cls, data: Any) -> Any:
        # vLLM's TokenizeRequest is TokenizeCompletionRequest (prompt) | TokenizeChatRequest (messages)
        if isinstance(data, Mapping) and (data.get("prompt") is None) == (data.get("messages") is None):
            raise _Problem("exactly one of prompt (a string) or messages must be given", "prompt")
        return data


_M = TypeVar("_M", bound=BaseModel)


class DetokenizeBody(_Lax):
    model: str | None = None
    tokens: list[int]


def validated(model: type[_M], body: object) -> _M:
    """``body`` as vLLM's request model takes it, or its validation answer (400, "Bad Request")."""
    if not isinstance(body, Mapping):
        raise VllmBadRequest("the request body must be a JSON object", None, 400, "Bad Request")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        param = None
        for error in errors:  # as vLLM's handler: a VLLMValidationError in the context names the param
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, _Problem):
                param = cause.param
                break
        message = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:5])
        raise VllmBadRequest(message, param, 400, "Bad Request") from None


# -- from a validated body to the engine's call ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What this engine accepts: vLLM's max_model_len and the emulator's own limits."""

    max_model_len: int
    max_prompt_tokens: int
    max_new_tokens: int
    vocab_size: int = VOCAB_SIZE


def _verify_sampling(body: SamplingBody) -> None:
    """vLLM's SamplingParams._verify_args over the fields the request set (its defaults pass)."""
    # (name, value, low, high, low open): the ranges vLLM's _verify_args enforces
    ranges: list[tuple[str, float | None, float, float, bool]] = [
        ("presence_penalty", body.presence_penalty, -2.0, 2.0, False),
        ("frequency_penalty", body.frequency_penalty, -2.0, 2.0, False),
        ("repetition_penalty", body.repetition_penalty, 0.0, math.inf, True),
        ("temperature", body.temperature, 0.0, math.inf, False),
        ("top_p", body.top_p, 0.0, 1.0, True),
        ("min_p", body.min_p, 0.0, 1.0, False),
    ]
    for name, value, low, high, open_low in ranges:
        if value is None:
            continue
        if not math.isfinite(value) or value < low or (open_low and value == low) or value > high:
            bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise VllmBadRequest(f"{name} must be in {bounds}, got {value}.", name)
    if body.top_k is not None and body.top_k < -1:
        raise VllmBadRequest(f"top_k must be 0 (disable), or at least 1, got {body.top_k}.", "top_k")
    if body.min_tokens < 0:
        raise VllmBadRequest(
            f"min_tokens must be greater than or equal to 0, got {body.min_tokens}.", "min_tokens"
        )
    if body.n != 1:  # vLLM samples n choices; the emulator generates one deterministic answer
        raise VllmBadRequest(f"n must be 1 on the emulator, got {body.n}", "n")


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One ``--lora-modules`` entry (vLLM's LoRAModulePath): the adapter's name, its path, and the base
    model it belongs to (None: the served model)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(item: str) -> LoraModule:
    """One ``--lora-modules`` value as vLLM's LoRAParserAction reads it: ``name=path`` (an ``=`` and no
    ``,``), else a JSON object ``{"name": ..., "path": ..., "base_model_name": ...}``. Raises
    ValueError naming what is wrong."""
    if "=" in item and "," not in item:
        parts = item.split("=")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"--lora-modules {item!r}: expected name=path")
        return LoraModule(parts[0], parts[1])
    try:
        obj = json.loads(item)
    except ValueError:
        raise ValueError(f"Invalid JSON format for --lora-modules: {item}") from None
    fields = {"name", "path", "base_model_name"}
    if not isinstance(obj, dict) or not {"name", "path"} <= obj.keys() or not obj.keys() <= fields:
        raise ValueError(
            f"Invalid fields for --lora-modules: {item} - give name, path and optionally base_model_name"
        )
    name, path, base = obj["name"], obj["path"], obj.get("base_model_name")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise ValueError(
            f"Invalid fields for --lora-modules: {item} - name and path must be non-empty strings"
        )
    if base is not None and not isinstance(base, str):
        raise ValueError(f"Invalid fields for --lora-modules: {item} - base_model_name must be a string")
    return LoraModule(name, path, base)


def check_model(requested: str | None, served: str, loras: Sequence[LoraModule] = ()) -> str | None:
    """vLLM's _check_model: an absent model is the served one; a loaded LoRA adapter's name is that
    adapter (returned: its requests are cached under it); another name is a 404."""
    if not requested or requested == served:
        return None
    if any(lora.name == requested for lora in loras):
        return requested
    raise VllmBadRequest(f"The model `{requested}` does not exist.", "model", 404)


def _token_ids(ids: Sequence[int], vocab_size: int) -> array:
    for t in ids:
        if not 0 <= t < vocab_size:
            raise VllmBadRequest(f"Token id {t} is out of vocabulary", "prompt")
    return array("I", ids)


def _max_tokens(given: int | None, default: int, prompt_tokens: int, limits: Limits) -> int:
    """vLLM's _validate_input and SamplingParams' max_tokens rule, then the emulator's own limit."""
    if prompt_tokens >= limits.max_model_len:
        raise VllmBadRequest(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the input messages.",
            "input_tokens",
        )
    if prompt_tokens > limits.max_prompt_tokens:
        raise VllmBadRequest(
            f"the prompt is {prompt_tokens} tokens long; this engine accepts at most "
            f"{limits.max_prompt_tokens}",
            "input_tokens",
        )
    if given is not None and prompt_tokens + given > limits.max_model_len:
        raise VllmBadRequest(
            f"'max_tokens' or 'max_completion_tokens' is too large: {given}. This model's maximum "
            f"context length is {limits.max_model_len} tokens and your request has {prompt_tokens} "
            f"input tokens ({given} > {limits.max_model_len} - {prompt_tokens}).",
            "max_tokens",
        )
    tokens = given if given is not None else min(default, limits.max_model_len - prompt_tokens)
    if tokens < 1:
        raise VllmBadRequest(f"max_tokens must be at least 1, got {tokens}.", "max_tokens")
    if tokens > limits.max_new_tokens:
        raise VllmBadRequest(
            f"max_tokens must be at most {limits.max_new_tokens} on this engine, got {tokens}", "max_tokens"
        )
    return tokens


def _salts(body: SamplingBody, prompts: int) -> tuple[str | None, ...]:
    # vLLM salts every prompt of the request with the one string (block hashes start from it)
    return (body.cache_salt,) * prompts if body.cache_salt else ()


def _include_usage(body: SamplingBody) -> bool:
    # vLLM's should_include_usage: only when stream_options are given; include_usage defaults to true
    return bool(body.stream_options is not None and body.stream_options.include_usage)


def continuous_usage(body: SamplingBody) -> bool:
    """stream_options.continuous_usage_stats: every streamed chunk carries the usage so far (vLLM:
    only when usage is included at all)."""
    options = body.stream_options
    return bool(options is not None and options.include_usage and options.continuous_usage_stats)


def completion_call(body: CompletionBody, limits: Limits) -> Call:
    prompt = body.prompt
    if isinstance(prompt, str):
        prompts, batch = [tokenize(prompt)], False
    elif prompt and all(isinstance(p, str) for p in prompt):
        prompts, batch = [tokenize(p) for p in prompt], True  # type: ignore[arg-type]
    elif prompt and all(isinstance(p, list) for p in prompt):
        prompts, batch = [_token_ids(p, limits.vocab_size) for p in prompt], True  # type: ignore[arg-type]
    else:
        prompts, batch = [_token_ids(prompt or [], limits.vocab_size)], False  # type: ignore[arg-type]
    if len(prompts) > MAX_BATCH:
        raise VllmBadRequest(
            f"prompt holds {len(prompts)} prompts; at most {MAX_BATCH} per request", "prompt"
        )
    if any(len(p) == 0 for p in prompts):
        raise VllmBadRequest("prompt must not be empty", "prompt")
    if body.echo:
        raise VllmBadRequest("echo is not supported by the emulator", "echo")
    _verify_sampling(body)
    max_new = tuple(
        _max_tokens(body.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, len(p), limits) for p in prompts
    )
    n = len(prompts)
    return Call(
        tuple(prompts), max_new, (None,) * n, bool(body.stream), batch, _include_usage(body), body.model,
        _salts(body, n),
    )  # fmt: skip


def chat_prompt(messages: list[dict[str, Any]]) -> array:
    """The prompt tokens of a chat, rendered by the template the whole fleet shares."""
    if not messages:
        raise VllmBadRequest("messages must not be empty", "messages")
    try:
        return tokenize(render_chat(messages))
    except ValueError as exc:
        raise VllmBadRequest(str(exc), "messages") from None


def chat_call(body: ChatBody, limits: Limits) -> Call:
    prompt = chat_prompt(body.messages)
    _verify_sampling(body)
    # as vLLM's _validate_input reads them (engine/serving.py): a 0 (or null) max_completion_tokens
    # falls back to max_tokens
    given = body.max_completion_tokens or body.max_tokens
    max_new = _max_tokens(given, DEFAULT_CHAT_MAX_TOKENS, len(prompt), limits)
    return Call(
        (prompt,), (max_new,), (None,), bool(body.stream), False, _include_usage(body), body.model,
        _salts(body, 1),
    )  # fmt: skip


# -- responses ---------------------------------------------------------------------------------------


def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage_object(snaps: Sequence[Snapshot], cached: int | None, *, details: bool) -> dict[str, object]:
    """vLLM's UsageInfo. ``prompt_tokens_details`` is ``{"cached_tokens": N}`` only with
    --enable-prompt-tokens-details (``details``), then also when N is 0; ``null`` without it. vLLM
    reports one request's count for the whole answer (the last prompt's, or in a stream the first
    output's): ``cached`` is that count."""
    usage = running_usage(sum(s.prompt_tokens for s in snaps), sum(s.completion_tokens for s in snaps))
    usage["prompt_tokens_details"] = {"cached_tokens": cached} if details and cached is not None else None
    return usage


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
    """The usage a chunk carries with continuous_usage_stats (vLLM sets only these three)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def usage_chunk(rid: str, obj: str, model: str, created: int, usage: dict[str, object]) -> dict[str, object]:
    """The last event of a stream asked for usage: no choices; dumped by vLLM with exclude_none, so
    a null prompt_tokens_details is left out."""
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": {k: v for k, v in usage.items() if v is not None},
    }


def _envelope(rid: str, obj: str, model: str, created: int) -> dict[str, object]:
    return {"id": rid, "object": obj, "created": created, "model": model}


def completion_response(
    rid: str,
    model: str,
    created: int,
    snaps: Sequence[Snapshot],
    texts: Sequence[str],
    usage: dict[str, object],
) -> dict[str, object]:
    choices = [
        {
            "index": i,
            "text": text,
            "logprobs": None,
            "finish_reason": snap.finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        for i, (snap, text) in enumerate(zip(snaps, texts, strict=True))
    ]
    return {
        **_envelope(rid, "text_completion", model, created),
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "kv_transfer_params": None,
    }


def completion_chunk(
    rid: str, model: str, created: int, index: int, text: str, finish_reason: str | None
) -> dict[str, object]:
    choice = {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    return {**_envelope(rid, "text_completion", model, created), "choices": [choice]}


def chat_response(
    rid: str, model: str, created: int, snap: Snapshot, content: str, usage: dict[str, object]
) -> dict[str, object]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content, "tool_calls": []},
        "logprobs": None,
        "finish_reason": snap.finish_reason,
        "stop_reason": None,
    }
    return {
        **_envelope(rid, "chat.completion", model, created),
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def chat_chunk(
    rid: str, model: str, created: int, delta: Mapping[str, object], finish_reason: str | None
) -> dict[str, object]:
    choice = {"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    return {**_envelope(rid, "chat.completion.chunk", model, created), "choices": [choice]}


def model_list(
    served: str, root: str, max_model_len: int, created: int, loras: Sequence[LoraModule] = ()
) -> dict[str, object]:
    """GET /v1/models: vLLM's ModelList: the served model's ModelCard (owned_by "vllm") with one
    ModelPermission, then one card per LoRA adapter (vLLM's show_available_models: id the adapter's
    name, root its path, parent its base model, else the served one; no max_model_len)."""
    cards = [_model_card(served, root, created, parent=None, max_model_len=max_model_len)]
    for lora in loras:
        cards.append(_model_card(lora.name, lora.path, created, lora.base_model_name or served, None))
    return {"object": "list", "data": cards}


def _model_card(
    name: str, root: str, created: int, parent: str | None, max_model_len: int | None
) -> dict[str, object]:
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
