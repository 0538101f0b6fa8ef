"""How SGLang reads a request's JSON fields: its request models are pydantic in lax mode (the OpenAI
bodies in entrypoints/openai/protocol.py; FastAPI validates /generate's GenerateReqInput dataclass
the same way). A field typed float takes "0.7"; one typed int takes 50.0 or "50" but not 50.5; a
bool takes "yes"/"false"/0/1 but not "maybe". The emulator judges requests with these, and the
gateway and the sidecar read fields with them, so no hop refuses what the engine serves.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

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
