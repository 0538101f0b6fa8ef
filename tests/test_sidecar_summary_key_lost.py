"""A summary key Redis lost without an outage is written again.

The sidecar writes its summary when its mirror changed and otherwise only refreshes the key's TTL
(PEXPIRE). A key that disappeared while Redis stayed up (evicted under ``maxmemory`` — a
``volatile-*`` policy picks exactly such keys with a TTL, and summaries are the fleet's largest —
or deleted by hand, a ``FLUSHDB``) was never written again while the replica's cache stayed as it
was: PEXPIRE of a missing key does nothing, and no outage was seen to trigger the republish.
Gateways then routed every prompt that replica holds as a miss. PEXPIRE's answer says whether the
key is there; a missing summary is written again at the next round.

A real Redis (Valkey) on 127.0.0.1, the real sidecar (``listening``) in front of a stand-in engine.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, RedisServer, eventually, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.sidecar import listening
from prefixfleet.router.summary import decode_summary

pytestmark = pytest.mark.timeout(60)
FLEET = "lostkey"


async def test_a_summary_deleted_from_a_live_redis_comes_back(redis_server: RedisServer) -> None:
    async def generate(_request: web.Request) -> web.Response:
        return web.json_response({"text": "", "meta_info": {}})

    app = stand_in_engine({"/generate": generate})
    client = redis_server.client()
    key = FleetKeys(FLEET).summary("w0")

    def published_blocks() -> int:
        raw = client.get(key)
        return 0 if raw is None else len(decode_summary(raw).blocks)

    config = dict(redis_url=redis_server.url, fleet=FLEET, publish_interval_s=0.05)
    async with (
        serve_aiohttp(app) as engine,
        listening(standalone_sidecar(engine, **config)) as served,
        aiohttp.ClientSession() as http,
    ):
        prompt = " ".join(f"word{i}" for i in range(64))
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 1}}
        async with http.post(f"http://{LOOPBACK}:{served.port}/generate", json=body) as resp:
            assert resp.status == 200
        blocks = await eventually(published_blocks, 30, "the first summary")
        version = served.sidecar.s.summary_version
        assert client.delete(key) == 1
        assert await eventually(published_blocks, 10, "the summary written again") == blocks
        assert served.sidecar.s.summary_version > version
