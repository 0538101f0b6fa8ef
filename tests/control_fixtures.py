"""The fleet's control token as a test's client gets it: from the fleet's Redis, with the product's
own reader (router.control.fleet_control_token), as the operator and the local fleet do.

``await fleet_token(redis_url, fleet)`` in a coroutine, ``fleet_token_now(redis_url, fleet)`` in plain
code; ``token_header(token)`` is the header a control request carries.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as aioredis

from prefixfleet.router.control import control_headers, fleet_control_token
from prefixfleet.router.keys import DEFAULT_FLEET, FleetKeys


async def fleet_token(redis_url: str, fleet: str = DEFAULT_FLEET) -> str:
    client = aioredis.from_url(redis_url)
    try:
        return await fleet_control_token(client, FleetKeys(fleet))
    finally:
        await client.aclose()


def fleet_token_now(redis_url: str, fleet: str = DEFAULT_FLEET) -> str:
    """The token from plain (synchronous) code, also when called from a coroutine's helper: read in
    a thread of its own, with its own event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, fleet_token(redis_url, fleet)).result()


def token_header(token: str) -> dict[str, str]:
    return control_headers(token)
