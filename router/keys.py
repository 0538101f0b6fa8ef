"""Redis key layout of one fleet (documented in docs/redis.md). Every key starts with ``pf:{fleet}:``.

:func:`deregister_worker` removes what one worker owns under that layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

DEFAULT_FLEET = "default"
# Matched with fullmatch: ``$`` would also accept a trailing newline, which then ends up in every key.
# 127: room for the operator's `<namespace>.<fleet name>` (a namespace has up to 63 characters, a
# PrefixCacheFleet name up to 47).
_FLEET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,126}")


def validate_fleet_name(fleet: str) -> str:
    if not isinstance(fleet, str) or not _FLEET_NAME.fullmatch(fleet):
        raise ValueError(
            f"fleet name {fleet!r} must be 1-127 characters of letters, digits, '_', '.' or '-' "
            "starting with a letter or digit"
        )
    return fleet


@dataclass(frozen=True, slots=True)
class FleetKeys:
    fleet: str = DEFAULT_FLEET

    def __post_init__(self) -> None:
        validate_fleet_name(self.fleet)

    @property
    def prefix(self) -> str:
        return f"pf:{self.fleet}:"

    @property
    def members(self) -> str:
        """HASH worker_id -> member JSON (url, state, model, revision, ...)."""
        return f"{self.prefix}members"

    def summary(self, worker_id: str) -> str:
        """STRING (binary summary v1, TTL'd)."""
        return f"{self.prefix}summary:{worker_id}"

    def load(self, worker_id: str) -> str:
        """STRING (load JSON, small, frequent, TTL'd): the worker's heartbeat."""
        return f"{self.prefix}load:{worker_id}"

    def engine(self, worker_id: str) -> str:
        """STRING (engine JSON, small, TTL'd): what the worker's engine states about itself (its
        served model names, LoRA adapters, API), written by a sidecar run with ``--no-self-register``,
        whose member record the operator writes without them (records.EngineRecord)."""
        return f"{self.prefix}engine:{worker_id}"

    @property
    def loads(self) -> str:
        """Pub/sub channel: every load record as it is written, ``"<worker>\\n<load JSON>"``."""
        return f"{self.prefix}loads"

    @property
    def sends(self) -> str:
        """Pub/sub channel: every gateway's routed requests as send notices (``records.encode_send``)."""
        return f"{self.prefix}sends"

    @property
    def control(self) -> str:
        """STRING, no TTL: the fleet's control token (``router.control``). A sidecar refuses its control
        routes and the engine's admin routes without it; created by the first member that needs it
        (``SET NX``). Delete it to rotate: every member reads the new one at its next need."""
        return f"{self.prefix}control"

    @property
    def events(self) -> str:
        """Pub/sub channel: change notices, one line each: ``joined <id>`` and ``left <id>`` (the
        operator, a sidecar leaving, the local fleet's reaper) and ``state <id> <state>`` (a sidecar).
        For people and tooling (``redis-cli subscribe``): gateways read membership and state from
        the members hash and the load records, within a refresh (0.2 s) or a load push."""
        return f"{self.prefix}events"


async def deregister_worker(
    redis: aioredis.Redis, keys: FleetKeys, worker_id: str, *, member: bool = True
) -> None:
    """Take ``worker_id`` out of the fleet: its member entry, load, engine record and summary, then ``left
    <id>`` on the events channel (gateways drop it at their next refresh, within 0.2 s).

    A sidecar does this on a clean shutdown; the local fleet's reaper does it for one killed hard.
    ``member=False`` leaves the members hash alone (a sidecar run with ``--no-self-register``: the
    operator owns membership). No timeout here: callers bound it with their own.
    """
    pipe = redis.pipeline(transaction=False)
    if member:
        pipe.hdel(keys.members, worker_id)
    pipe.delete(keys.load(worker_id), keys.summary(worker_id), keys.engine(worker_id))
    pipe.publish(keys.events, f"left {worker_id}")
    await pipe.execute()
