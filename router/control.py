"""The fleet's control token: who may drive a sidecar's control routes and reach the engine's admin routes.

A sidecar listens on its pod's IP, so every pod of the cluster can reach it. Its control routes change
what the replica does (``POST /prefixfleet/state``, ``POST /prefixfleet/warm``,
``POST /prefixfleet/reset_rates``) or give out what its
clients sent (``GET /prefixfleet/prefix/{hash}`` answers with a kept request body, prompt included), and
the engine behind it has admin routes (SGLang's ``/flush_cache``, vLLM's ``/reset_prefix_cache``...).
Those need the fleet's control token in the ``X-Prefixfleet-Token`` header.

The token lives in the fleet's Redis (``FleetKeys.control``): every member of the fleet (operator,
sidecars, the local fleet) already holds the fleet's Redis credentials, so the token trusts exactly
who the fleet already trusts, needs no Kubernetes Secret and no pod restart, and rotates by deleting
the key. The first member that needs it creates it with ``SET NX`` (so concurrent creators agree).
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from .keys import FleetKeys

CONTROL_HEADER = "X-Prefixfleet-Token"
TOKEN_BYTES = 32  # 256 bits, as URL-safe base64 (43 characters)
# A sidecar with no Redis (standalone, no fleet) takes its token from here; unset, its control routes
# are open (it says so once at start)
CONTROL_TOKEN_ENV = "PREFIXFLEET_CONTROL_TOKEN"
# The sidecar's own routes that need the token (aiohttp route templates): they change what the replica
# does, or give out what its clients sent (a kept request body, hot prefixes' tokens). Its
# /prefixfleet/status and /metrics stay open: read-only figures (what it publishes to Redis anyway,
# and the engine's metrics), read by drain checks, probes and Prometheus, which hold no token.
CONTROL_ROUTES = frozenset(
    {
        "/prefixfleet/state",
        "/prefixfleet/warm",
        "/prefixfleet/prefix/{hash}",
        "/prefixfleet/hot",
        "/prefixfleet/reset_rates",
    }
)
# A cached token is checked against only while its reading is younger than this; an older one is read
# again first (concurrent checks share the read). So a rotation (the key deleted) holds within a
# second even for a client that keeps sending the old token, and a flood of control requests costs
# Redis at most one read a second. Data-plane routes never ask.
REREAD_INTERVAL_S = 1.0
# Redis cannot be read: the cached token is still checked against for this long after the last read
# that worked, then control requests get 503 until Redis answers (never open). Why a grace: a Redis
# blip in the middle of a sequence (warming -> warm -> ready, draining -> ready when the stop failed)
# must not leave the replica out of rotation; why bounded: a sidecar cut off from Redis cannot see a
# rotation, so an old token must not live on for the whole outage.
UNCONFIRMED_GRACE_S = 30.0


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
    """Whether ``given`` is the fleet's token; in constant time, so timing does not give it away.
    A header value that was not UTF-8 (aiohttp keeps such bytes as surrogate escapes) is compared
    as its bytes, never an error."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


class Verdict(enum.Enum):
    """What a control request's token was found to be."""

    ACCEPTED = "accepted"
    MISSING = "missing"  # no header (or an empty one)
    WRONG = "wrong"  # not the fleet's token
    UNAVAILABLE = "unavailable"  # no token known and none could be read (Redis down)


def reread_due(last_read: float | None, now: float, interval_s: float) -> bool:
    """Whether a check may send the sidecar to Redis again (none within ``interval_s``)."""
    return last_read is None or now - last_read >= interval_s


def token_verdict(expected: str | None, given: str | None, age_s: float | None, grace_s: float) -> Verdict:
    """What a control request's token is, checked against ``expected``, read ``age_s`` ago (None:
    never read; a fixed token is age 0). A token unknown, or known but unconfirmed for longer than
    ``grace_s``, judges nothing: UNAVAILABLE (503), never open."""
    if not given:
        return Verdict.MISSING
    if expected is None or age_s is None or age_s > grace_s:
        return Verdict.UNAVAILABLE
    return Verdict.ACCEPTED if token_matches(expected, given) else Verdict.WRONG


@dataclass(slots=True)
class ControlTokenSource:
    """The token a sidecar checks control requests against: fixed (``read`` None: a standalone
    sidecar's :data:`CONTROL_TOKEN_ENV`) or the fleet's, read through ``read`` (from Redis: see
    :func:`fleet_control_token`) whenever the cached one was read more than ``interval_s`` ago, at
    most once per ``interval_s``; concurrent checks share one read. When reads fail, the cached
    token serves for ``grace_s`` after the last read that worked (:data:`UNCONFIRMED_GRACE_S`).
    ``error``: why the last read failed (None after a success)."""

    read: Callable[[], Awaitable[str]] | None = None
    token: str | None = None
    interval_s: float = REREAD_INTERVAL_S
    grace_s: float = UNCONFIRMED_GRACE_S
    clock: Callable[[], float] = time.monotonic
    error: str | None = None
    describe_error: Callable[[BaseException], str] = str
    _last_read: float | None = None  # when the last read started, whatever its outcome
    _confirmed: float | None = None  # when the last read that worked started: the token's age
    _reading: asyncio.Task[None] | None = None

    async def check(self, given: str | None) -> Verdict:
        if not given:
            return Verdict.MISSING  # nothing Redis could say changes this: no read
        if self.read is None:
            return token_verdict(self.token, given, 0.0, self.grace_s)
        age = self._age()
        if age is None or age >= self.interval_s:  # a matching token is no reason to skip the read
            await self.refresh()
            age = self._age()
        return token_verdict(self.token, given, age, self.grace_s)

    def _age(self) -> float | None:
        """Seconds since the cached token was read (None: never read)."""
        return None if self._confirmed is None else self.clock() - self._confirmed

    async def refresh(self) -> None:
        """Read the token if a read is due (none within ``interval_s``), or wait for the one in
        flight; a fixed token is never read. Failures are kept in :attr:`error`, never raised."""
        if self.read is not None and self._reading is None:
            now = self.clock()
            if reread_due(self._last_read, now, self.interval_s):
                self._last_read = now
                self._reading = asyncio.ensure_future(self._read_once(self.read, now))
        reading = self._reading
        if reading is not None:
            # shielded: a client leaving cancels its own wait, not the read others wait on
            await asyncio.shield(reading)

    async def _read_once(self, read: Callable[[], Awaitable[str]], started: float) -> None:
        try:
            self.token = await read()
            # aged from the read's start: Redis held this value at some moment since then
            self._confirmed = started
            self.error = None
        except (RedisError, OSError, TimeoutError) as exc:  # down, refused (ACL), slow: said, never open
            self.error = self.describe_error(exc)
        finally:
            self._reading = None

    def close(self) -> None:
        """Cancel a read in flight (the sidecar is stopping)."""
        if self._reading is not None:
            self._reading.cancel()
