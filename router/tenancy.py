"""Tenant isolation from a trusted header (pure): the gateway's ``--tenant-header`` mode.

With isolation on, every request must carry the tenant header (set by the authenticating proxy in
front of the gateway, never by end users); the gateway writes the tenant into the body's
``cache_salt`` — replacing whatever the client put there, so no client can name another tenant's
cache — and forwards that body. The gateway's block hashes, the sidecar's mirror and the engine's
prefix cache (vLLM's ``cache_salt``; the emulator's) are then all separated per tenant.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .requests import BadRequest, is_utf8

DEFAULT_TENANT_HEADER = "X-Prefixfleet-Tenant"
MAX_TENANT_CHARS = 256


def checked_tenant(tenant: str | None, header: str) -> str:
    """The tenant a request's header names (stripped); raises :class:`BadRequest` naming the header
    when it is missing or unusable."""
    if tenant is None or not tenant.strip():
        raise BadRequest(f"header {header} is required: this gateway isolates tenants", param=header)
    if len(tenant) > MAX_TENANT_CHARS:
        raise BadRequest(f"header {header} is longer than {MAX_TENANT_CHARS} characters", param=header)
    if not is_utf8(tenant):
        raise BadRequest(f"header {header} must be UTF-8 text", param=header)
    return tenant.strip()


def salted_body(obj: dict[str, Any], tenant: str) -> bytes:
    """Set ``obj``'s ``cache_salt`` to ``tenant`` (in place: the caller validates the same value)
    and return it encoded as the body to forward. Raises :class:`BadRequest` naming the field that
    holds a number no JSON number can carry once parsed (``1e400``, a ``NaN`` literal): re-encoded
    it would be ``Infinity``, invalid JSON."""
    obj["cache_salt"] = tenant
    try:
        try:
            return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except UnicodeEncodeError:  # a "\ud800" escape in the body has no UTF-8 form: keep it escaped
            return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        # 1e400 (no double holds it) or a NaN/Infinity literal read as a non-finite float: no JSON
        # number says that, and json.dumps would write Infinity, which is not JSON either
        try:
            where = non_finite_number(obj) or "body"
        except RecursionError:  # nested about as deep as the parser allows
            where = "body"
        raise BadRequest(
            f"{where} is not a finite number (JSON numbers must be within ±1.8e308)", param=where
        ) from None


def non_finite_number(value: Any, path: str = "") -> str | None:
    """Where in ``value`` (as ``messages[0].x``) the first infinite or NaN float is; None if nowhere."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        items = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for where, item in items:
        found = non_finite_number(item, where)
        if found is not None:
            return found
    return None
