"""A gateway shares its sends only while someone else listens on the fleet's sends channel.

Specification: a lone gateway (no other subscriber on ``pf:{fleet}:sends``) queues no send notice,
so a single-gateway fleet pays no publish and no echo per request; as soon as a refresh counts
another listener (a peer gateway, or here a test client), routed sends are published again.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from fleet_fixtures import RedisServer, eventually

from prefixfleet.router.gateway import Gateway, GatewayConfig
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_send

FLEET = "sharegate"


@pytest.mark.timeout(60)
async def test_lone_gateway_keeps_its_sends_and_shares_once_someone_listens(
    redis_server: RedisServer,
) -> None:
    gateway = Gateway(GatewayConfig(port=0, redis_url=redis_server.url, fleet=FLEET))
    runner = web.AppRunner(gateway.app(), handle_signals=False)
    await runner.setup()  # starts the refresh, loads/sends subscription and share loops
    client = aioredis.from_url(redis_server.url)
    listener = client.pubsub(ignore_subscribe_messages=True)
    try:
        # the gateway's own subscription comes up in its task; until it says so, its own subscriber
        # counts as a peer (a 5 s loop fell through to the assertions below on a slow machine)
        await eventually(lambda: gateway._sends_subscribed, 30, "the gateway's own sends subscription")
        await gateway.refresh_once()
        gateway._share_send("w0", [1, 2, 3], time.time())
        assert gateway._shares == []  # nobody else listens: nothing to publish

        await listener.subscribe(FleetKeys(FLEET).sends)
        await gateway.refresh_once()
        gateway._share_send("w0", [1, 2, 3], time.time())
        notice = None
        for _ in range(100):
            message = await listener.get_message(timeout=0.1)
            if message is not None:
                notice = decode_send(message["data"])
                break
        assert notice is not None and (notice.worker, list(notice.hashes)) == ("w0", [1, 2, 3])
    finally:
        await listener.aclose()
        await client.aclose()
        await runner.cleanup()
