"""The engines' ``--api-key``: which requests must carry ``Authorization: Bearer <key>``, and the
answer to one that does not (pure checks; the aiohttp middleware is a thin shell).

As the real engines do it (their sources, read 2026-12-02):

* vLLM (``AuthenticationMiddleware``, ``vllm/entrypoints/openai/server_utils.py``): with
  ``--api-key`` (one or more keys; vLLM also reads ``VLLM_API_KEY``, the emulator does not: see
  emulator/cli.py) every request whose path starts with ``/v1`` must carry one of the keys;
  ``/health``, ``/metrics``, ``/tokenize`` ... stay open.
* SGLang (``add_api_key_middleware``, ``python/sglang/srt/utils``): with ``--api-key`` every path but
  those starting with ``/health`` or ``/metrics`` needs the key.

Both skip OPTIONS, read the header as ``<scheme> <key>`` with the scheme in any case, and refuse
with a 401 whose body is ``{"error": "Unauthorized"}``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence

from aiohttp import web

from .serving import Handler

UNAUTHORIZED_BODY = {"error": "Unauthorized"}

Guarded = Callable[[str], bool]  # path -> whether the key is required there


def vllm_guarded(path: str) -> bool:
    return path.startswith("/v1")


def sglang_guarded(path: str) -> bool:
    return not path.startswith(("/health", "/metrics"))


def key_problem(key: str) -> str | None:
    """Why ``key`` can never be presented (None: it can). A header value holds no control character,
    so a key with one (a Secret file's trailing newline) would refuse every client, said at start."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return "--api-key has a control character (a trailing newline?): no Authorization header can carry it"
    return None


def _digest(text: str) -> bytes:
    # compared as digests, as vLLM does: equal lengths, and any text (compare_digest refuses non-ASCII str)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def authorized(
    method: str, path: str, authorization: str | None, keys: Sequence[str], guarded: Guarded
) -> bool:
    """Whether a request passes an engine run with ``keys`` (none: every request passes)."""
    if not keys or method == "OPTIONS" or not guarded(path):
        return True
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    given_digest = _digest(given)
    match = False
    for key in keys:  # every key compared: the time taken does not say which one matched
        match |= secrets.compare_digest(given_digest, _digest(key))
    return match


def api_key_middleware(keys: Sequence[str], guarded: Guarded) -> object:
    """The middleware refusing what :func:`authorized` refuses with the engines' 401."""
    wanted = tuple(keys)

    @web.middleware
    async def api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if authorized(request.method, request.path, request.headers.get("Authorization"), wanted, guarded):
            return await handler(request)
        return web.json_response(UNAUTHORIZED_BODY, status=401)

    return api_key
