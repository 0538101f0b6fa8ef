"""The fleet's control token (router.control): made once per fleet in its Redis, agreed on by
concurrent creators, rotated by deleting the key, compared without leaking by timing."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from prefixfleet.router.control import CONTROL_HEADER, control_headers, fleet_control_token, token_matches
from prefixfleet.router.keys import FleetKeys

from .fleet_fixtures import RedisServer, redis_server  # noqa: F401 (fixture)


def test_concurrent_creators_agree_and_other_fleets_differ(redis_server: RedisServer) -> None:  # noqa: F811
    async def scenario() -> tuple[list[str], str]:
        clients = [aioredis.from_url(redis_server.url) for _ in range(8)]
        try:
            a = FleetKeys("a")
            tokens = await asyncio.gather(*(fleet_control_token(c, a) for c in clients))
            other = await fleet_control_token(clients[0], FleetKeys("b"))
            return list(tokens), other
        finally:
            for c in clients:
                await c.aclose()

    tokens, other = asyncio.run(scenario())
    assert len(set(tokens)) == 1
    assert len(tokens[0]) >= 43  # 256 bits as URL-safe base64
    assert other != tokens[0]
    assert redis_server.client().get("pf:a:control").decode() == tokens[0]


def test_deleting_the_key_rotates_it(redis_server: RedisServer) -> None:  # noqa: F811
    async def scenario() -> tuple[str, str, str]:
        client = aioredis.from_url(redis_server.url)
        try:
            keys = FleetKeys("f")
            first = await fleet_control_token(client, keys)
            again = await fleet_control_token(client, keys)
            await client.delete(keys.control)
            return first, again, await fleet_control_token(client, keys)
        finally:
            await client.aclose()

    first, again, rotated = asyncio.run(scenario())
    assert first == again
    assert rotated != first


def test_token_matches_only_the_same_nonempty_token() -> None:
    assert token_matches("s3cret", "s3cret")
    assert not token_matches("s3cret", "s3cre")
    assert not token_matches("s3cret", None)
    assert not token_matches(None, None)
    assert not token_matches("", "")
    assert control_headers("t") == {CONTROL_HEADER: "t"}
