"""Parse and validate an inference request body into what routing needs (pure; no I/O).

Both the gateway and the sidecar see the same bytes and must derive the same tokens: prompts are
tokenized with :mod:`prefixfleet.tokenizer` (chat messages via ``render_chat``), explicit token ids
are taken as they are. A batch (list of prompts) is routed by its first prompt, with that prompt's
``cache_salt`` and ``max_new_tokens`` (a batch may give one of each per prompt): the engine caches
each prompt under its own salt, so the first prompt's is the namespace its tokens land in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixfleet.sglang_fields import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    DEFAULT_GENERATE_MAX_NEW_TOKENS,
    FieldError,
    cache_salts,
    generated_tokens,
    lax_bool,
    lax_int,
)
from prefixfleet.tokenizer import count_tokens, render_chat, tokenize

from .radix import as_token_bytes

GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
DEFAULT_MAX_PROMPT_TOKENS = 262144
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_MAX_TOKEN_ID = 2**32 - 1


class BadRequest(ValueError):
    """A request the client must fix; carries the HTTP status and the offending field."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    path: str
    token_bytes: bytes  # little-endian uint32 ids (radix tree edge format)
    num_tokens: int
    stream: bool
    max_new_tokens: int
    tenant_salt: str | None  # cache-isolation salt (vLLM's ``cache_salt``), None = shared
    model: str | None
    prompts: int = 1  # a batch's prompts; the fields above describe its first
    # SGLang's LoRA adapter field (/generate; an extra field on its OpenAI routes), the first
    # prompt's; None: none given. What it means is blockhash.requested_adapter's to say.
    lora_path: str | None = None
    other_prompts_tokens: int = 0  # the tokens of a batch's prompts after its first

    @property
    def adapter_model(self) -> str | None:
        """The ``model`` field as an engine reads it to name a LoRA adapter
        (``blockhash.requested_adapter``): None on ``/generate``, whose SGLang ``GenerateReqInput``
        has no such field (it names an adapter by ``lora_path`` alone; ``model`` still routes)."""
        return None if self.path == "/generate" else self.model

    def uncached_tokens(self, matched_tokens: int) -> int:
        """The prefill this request is predicted to cost when its first prompt matches
        ``matched_tokens``: the engine prefills every prompt of a batch, and the others (cached
        under their own salts, which routing does not look up) are counted as uncached."""
        return max(self.num_tokens - matched_tokens, 0) + self.other_prompts_tokens


def is_utf8(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate: from a JSON ``\\ud800`` escape, or
    header bytes that were not UTF-8, which aiohttp keeps as surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Fields are read as SGLang reads them (prefixfleet.sglang_fields): a gateway or sidecar stricter
# than the engine would refuse requests the engine serves. (sampling_params on /generate is a plain
# dict SGLang does not coerce: read by its own rule there, generated_tokens.)


def _int_field(obj: Mapping[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    number = lax_int(value)
    if number is None:
        raise BadRequest(f"field '{name}' must be an integer", param=name)
    if number < 0:
        raise BadRequest(f"field '{name}' must not be negative", param=name)
    return number


def _token_ids(value: list[Any], param: str) -> bytes:
    if all(type(t) is int and 0 <= t <= _MAX_TOKEN_ID for t in value):  # the usual case: one pass
        return as_token_bytes(value)
    ids = [lax_int(t) for t in value]
    for i, t in enumerate(ids):
        if t is None or not 0 <= t <= _MAX_TOKEN_ID:
            raise BadRequest(f"{param}[{i}] must be a token id (integer in [0, 2**32))", param=param)
    return as_token_bytes(ids)


def _prompt_tokens(value: Any, param: str) -> tuple[bytes, int, bool, int]:
    """Tokens of a prompt field's first prompt, how many prompts it holds, whether it is a batch and
    how many tokens its other prompts hold: a string, a list of token ids, or a batch (a list of
    strings or of token-id lists)."""
    if isinstance(value, str):
        return as_token_bytes(tokenize(value)), 1, False, 0
    if isinstance(value, list):
        if not value:
            raise BadRequest(f"field '{param}' must not be empty", param=param)
        first = value[0]
        if isinstance(first, str):
            if not all(isinstance(p, str) for p in value):
                raise BadRequest(f"field '{param}' must be a list of strings, not a mix", param=param)
            others = sum(count_tokens(p) for p in value[1:])
            return as_token_bytes(tokenize(first)), len(value), True, others
        if isinstance(first, list):
            if not all(isinstance(p, list) for p in value):
                raise BadRequest(f"field '{param}' must be a list of token-id lists, not a mix", param=param)
            others = sum(len(p) for p in value[1:])
            return _token_ids(first, f"{param}[0]"), len(value), True, others
        return _token_ids(value, param), 1, False, 0
    raise BadRequest(
        f"field '{param}' must be a string, a list of strings or a list of token ids", param=param
    )


def _first_salt(value: Any, prompts: int, batch: bool) -> str | None:
    """The first prompt's ``cache_salt`` (None: unsalted), every salt judged as SGLang judges it."""
    try:
        salts = cache_salts(value, prompts, batch)
    except FieldError as exc:
        raise BadRequest(str(exc), param="cache_salt") from None
    for salt in salts:
        if salt is not None and not is_utf8(salt):  # e.g. "\ud800" in the JSON: hashed as UTF-8 bytes
            raise BadRequest(
                "field 'cache_salt' must be valid Unicode text (it holds a lone surrogate)",
                param="cache_salt",
            )
    return salts[0] if salts else None


def _first_lora_path(value: Any) -> str | None:
    """The first prompt's ``lora_path``: a string, or a batch's list of one per prompt (entries may
    be null). Read leniently: only SGLang reads the field (vLLM ignores it), and a value SGLang
    refuses is its error to give; here anything else is no adapter."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, str) and value else None


def _first_max_new_tokens(sampling: Any, prompts: int, batch: bool) -> int | None:
    """The first prompt's /generate ``sampling_params.max_new_tokens``: a plain dict in SGLang, or a
    list of one per prompt in a batch; read by :func:`prefixfleet.sglang_fields.generated_tokens`."""
    if sampling is None:
        return None
    if isinstance(sampling, list):
        if not batch or len(sampling) != prompts:
            raise BadRequest("a list of sampling_params needs one entry per prompt", param="sampling_params")
        entries = sampling
    else:
        entries = [sampling]
    counts = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise BadRequest("field 'sampling_params' must be an object", param="sampling_params")
        value = entry.get("max_new_tokens")
        try:
            counts.append(None if value is None else generated_tokens(value))
        except FieldError as exc:
            raise BadRequest(str(exc), param="sampling_params.max_new_tokens") from None
    return counts[0]


def load_json_body(body: bytes) -> Any:
    """The JSON value of a request body; raise :class:`BadRequest` when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError as exc:  # also an integer above Python's 4300-digit limit, not a JSONDecodeError
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # e.g. "[[[[...": the C scanner gives up on deep nesting
        raise BadRequest("request body is not valid JSON: nested too deeply") from None


def load_json_object(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body; raise :class:`BadRequest` when it is not JSON or not an object."""
    obj = load_json_body(body)
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    return obj


def parse_inference_request(
    path: str,
    body: bytes,
    *,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
) -> InferenceRequest:
    """Validate ``body`` for ``path`` (one of :data:`GENERATE_PATHS`); raise :class:`BadRequest`."""
    return inference_request(path, load_json_body(body), max_prompt_tokens=max_prompt_tokens)


def inference_request(
    path: str,
    obj: Any,
    *,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
) -> InferenceRequest:
    """Validate a body already parsed (:func:`load_json_body`) for ``path``, as
    :func:`parse_inference_request` does the raw bytes: the gateway parses once and hands the value
    both to tenancy and here."""
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    stream = obj.get("stream", False)
    if stream is None:
        stream = False
    stream = lax_bool(stream)
    if stream is None:
        raise BadRequest("field 'stream' must be a boolean", param="stream")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("field 'model' must be a string", param="model")

    if path == "/generate":
        text, ids = obj.get("text"), obj.get("input_ids")
        if (text is None) == (ids is None):
            raise BadRequest("exactly one of the fields 'text' and 'input_ids' is required", param="text")
        prompt_field = "text" if text is not None else "input_ids"
        tokens, prompts, batch, others = _prompt_tokens(text if text is not None else ids, prompt_field)
        max_new = _first_max_new_tokens(obj.get("sampling_params"), prompts, batch)
        default_max_new = DEFAULT_GENERATE_MAX_NEW_TOKENS
    elif path == "/v1/completions":
        if "prompt" not in obj:
            raise BadRequest("field 'prompt' is required", param="prompt")
        prompt_field = "prompt"
        tokens, prompts, batch, others = _prompt_tokens(obj["prompt"], prompt_field)
        max_new = _int_field(obj, "max_tokens")
        default_max_new = DEFAULT_COMPLETION_MAX_TOKENS
    elif path == "/v1/chat/completions":
        messages = obj.get("messages")
        if messages is None:
            raise BadRequest("field 'messages' is required", param="messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("field 'messages' must be a non-empty list of messages", param="messages")
        try:
            text = render_chat(messages)
        except ValueError as exc:
            raise BadRequest(str(exc), param="messages") from None
        prompt_field = "messages"
        tokens, prompts, batch, others = as_token_bytes(tokenize(text)), 1, False, 0
        max_new = _int_field(obj, "max_completion_tokens")
        if max_new is None:
            max_new = _int_field(obj, "max_tokens")
        default_max_new = DEFAULT_CHAT_MAX_TOKENS
    else:
        raise BadRequest(f"unknown generation endpoint {path}", status=404)

    salt = _first_salt(obj.get("cache_salt"), prompts, batch)
    num_tokens = len(tokens) // 4
    if num_tokens > max_prompt_tokens:
        raise BadRequest(
            f"field '{prompt_field}' has {num_tokens} tokens; at most {max_prompt_tokens} are accepted",
            status=413,
            param=prompt_field,
        )
    return InferenceRequest(
        path=path,
        token_bytes=tokens,
        num_tokens=num_tokens,
        stream=stream,
        max_new_tokens=max_new if max_new is not None else default_max_new,  # as the engine runs it
        tenant_salt=salt,
        model=model,
        prompts=prompts,
        other_prompts_tokens=others,
        lora_path=_first_lora_path(obj.get("lora_path")),
    )
