"""The summary a sidecar publishes carries the cache identity the engine named, without waiting for a request.

A sidecar started without ``--model``/``--revision`` (``prefixfleet up`` starts them so) asks the
engine for its identity; until the engine answers, its mirror is named by the empty identity, and
the publish loop may already have written that mirror's (empty) summary. The engine's answer
replaces the mirror by one under the engine's identity; its change count started again at 0, the
count the first summary was published at, so the loop took it for published: Redis kept the
summary with the old ``identity_seed`` until the first request changed the mirror. Gateways hash a
worker's requests with its summary's ``identity_seed``, so the sends they counted there (their
overlay, their peers' send notices) were named by hashes no later summary holds.

Real Redis (Valkey) and HTTP on 127.0.0.1: a stand-in engine whose ``/get_server_info`` answers only
once the first summary is in Redis, the real sidecar (``listening``).
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from fleet_fixtures import RedisServer, eventually, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.sidecar import listening
from prefixfleet.router.summary import decode_summary

pytestmark = pytest.mark.timeout(60)
FLEET = "identity"


async def test_the_engines_identity_reaches_the_published_summary(redis_server: RedisServer) -> None:
    info_gate = asyncio.Event()

    async def server_info(_request: web.Request) -> web.Response:
        await info_gate.wait()
        info = {"served_model_name": "m2", "revision": "r2", "max_total_num_tokens": 50_000}
        return web.json_response(info)

    app = stand_in_engine(get={"/get_server_info": server_info})
    client = redis_server.client()
    key = FleetKeys(FLEET).summary("w0")

    def published_seed() -> int | None:
        raw = client.get(key)
        return None if raw is None else decode_summary(raw).identity_seed

    async with serve_aiohttp(app) as engine:
        config = standalone_sidecar(
            engine,
            model=None,
            revision=None,
            cache_tokens=None,
            redis_url=redis_server.url,
            fleet=FLEET,
            publish_interval_s=0.05,
        )
        async with listening(config) as served:
            await eventually(published_seed, 30, "the first summary")
            assert published_seed() == CacheIdentity().seed()  # the engine has not named it yet
            info_gate.set()
            await eventually(lambda: served.sidecar.s.mirror.identity.model == "m2", 30, "the identity")
            expected = CacheIdentity("m2", "r2").seed()
            what = "a summary under the engine's identity"
            await eventually(published_seed, 10, what, done=expected.__eq__)
