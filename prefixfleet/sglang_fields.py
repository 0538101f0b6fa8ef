"""How SGLang reads a request's JSON fields: its request models are pydantic in lax mode (the OpenAI
bodies in entrypoints/openai/protocol.py; FastAPI validates /generate's GenerateReqInput dataclass
the same way). A field typed float takes "0.7"; one typed int takes 50.0 or "50" but not 50.5; a
bool takes "yes"/"false"/0/1 but not "maybe". The emulator judges requests with these, and the
gateway and the sidecar read fields with them, so no hop refuses what the engine serves.

Two fields SGLang reads by rules of its own, not by a pydantic type: /generate's
``sampling_params.max_new_tokens`` (:func:`generated_tokens`) and ``cache_salt``
(:func:`cache_salts`). They raise :class:`FieldError`; each hop words it as its own 400.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import TypeAdapter, ValidationError

# How many tokens the engine generates when a request names no limit: SGLang's SamplingParams
# default (/generate, and chat with no max_tokens), and OpenAI's /v1/completions max_tokens default.
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 128

AS_FLOAT: TypeAdapter[float] = TypeAdapter(float)
AS_INT: TypeAdapter[int] = TypeAdapter(int)
AS_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


def lax_int(value: Any) -> int | None:
    """``value`` as an int field of SGLang's models reads it, or None when they would refuse it."""
    if type(value) is int:
        return value
    try:
        return AS_INT.validate_python(value)
    except ValidationError:
        return None


def lax_bool(value: Any) -> bool | None:
    """``value`` as a bool field of SGLang's models reads it, or None when they would refuse it."""
    if type(value) is bool:
        return value
    try:
        return AS_BOOL.validate_python(value)
    except ValidationError:
        return None


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class FieldError(ValueError):
    """A field SGLang refuses; the message names the field."""


def generated_tokens(value: Any, name: str = "sampling_params.max_new_tokens") -> int:
    """How many tokens a /generate ``sampling_params.max_new_tokens`` generates. SGLang hands the
    dict to SamplingParams untyped, checks only that it is not negative, and stops once the output
    holds at least that many tokens: 3 and 3.0 generate 3, 2.5 generates 3. Not finite, a bool or a
    string is refused (SGLang would never stop, or fails comparing it)."""
    if type(value) is float and math.isfinite(value):
        value = int(value) if value.is_integer() else value  # "got -3", as for the int -3
    elif type(value) is not int:
        raise FieldError(f"{name} must be an integer")
    if value < 0:  # before rounding up: -0.5 is refused, as SGLang refuses it
        raise FieldError(f"{name} must not be negative, got {value}")
    return math.ceil(value)


def cache_salts(value: Any, prompts: int, batch: bool, name: str = "cache_salt") -> tuple[str | None, ...]:
    """One salt per prompt (None: no salt), as SGLang's GenerateReqInput normalises ``cache_salt``
    (its OpenAI requests pass theirs on): a string salts every prompt; a batch also takes a list with
    one string per prompt; "" is no salt; absent is ``()``."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value or None,) * prompts
    if not batch:
        raise FieldError(f"{name} must be a string for a single prompt")
    if not isinstance(value, list):
        raise FieldError(f"{name} must be a string or a list of strings")
    if len(value) != prompts:
        raise FieldError(f"{name} holds {len(value)} salts for {prompts} prompts: give one per prompt")
    for i, each in enumerate(value):
        if not isinstance(each, str):
            raise FieldError(f"{name}[{i}] must be a string, got {shown(each)}")
    return tuple(each or None for each in value)
