"""The fleet's control token: who may drive a sidecar's control routes and reach the engine's admin routes.

A sidecar listens on its pod's IP, so every pod of the cluster can reach it. Its control routes change
what the replica does (``POST /prefixfleet/state``, ``POST /prefixfleet/warm``) or give out what its
clients sent (``GET /prefixfleet/prefix/{hash}`` answers with a kept request body, prompt included), and
the engine behind it has admin routes (SGLang's ``/flush_cache``, vLLM's ``/reset_prefix_cache``...).
Those need the fleet's control token in the ``X-Prefixfleet-Token`` header.

The token lives in the fleet's Redis (``FleetKeys.control``): every member of the fleet (operator,
sidecars, the local fleet) already holds the fleet's Redis credentials, so the token trusts exactly
who the fleet already trusts, needs no Kubernetes Secret and no pod restart, and rotates by deleting
the key. The first member that needs it creates it with ``SET NX`` (so concurrent creators agree).
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from .keys import FleetKeys

CONTROL_HEADER = "X-Prefixfleet-Token"
TOKEN_BYTES = 32  # 256 bits, as URL-safe base64 (43 characters)


async def fleet_control_token(redis: aioredis.Redis, keys: FleetKeys) -> str:
    """The fleet's control token, created when missing. Two commands, not ``SET NX GET``, so a
    Redis older than 7.0 serves it too; the ``SET NX`` makes every concurrent creator read one value."""
    await redis.set(keys.control, secrets.token_urlsafe(TOKEN_BYTES), nx=True)
    value = await redis.get(keys.control)
    if value is None:  # deleted between the two commands (a rotation): make the next one
        return await fleet_control_token(redis, keys)
    return value.decode() if isinstance(value, bytes) else str(value)


def control_headers(token: str) -> dict[str, str]:
    """The header a control request carries."""
    return {CONTROL_HEADER: token}


def token_matches(expected: str | None, given: str | None) -> bool:
    """Whether ``given`` is the fleet's token; in constant time, so timing does not give it away."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())
