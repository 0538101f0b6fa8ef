"""A replica drained while it warms stays draining when the warm-up ends.

``POST /prefixfleet/warm`` (holding traffic) puts the replica in ``warming`` and, when its prefixes
are replayed, back in the state it had. A ``POST /prefixfleet/state {"state": "draining"}`` that
arrives meanwhile (the replica is being taken out: an admin, a scale-down) must win: the warm-up
used to set ``ready`` at its end whatever happened meanwhile, so the drained replica went back
into rotation and took new requests while it was being removed. A state set meanwhile to
anything but ``warming`` is left alone; only the warm-up's own ``warming`` is lifted.

Real HTTP on 127.0.0.1: a stand-in source sidecar whose prefix lookup answers only when the test
says, the real sidecar (``listening``, no Redis) being warmed.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("meanwhile", ["draining", "ready"])
async def test_a_state_set_while_warming_is_the_state_after_the_warm_up(meanwhile: str) -> None:
    asked, answer = asyncio.Event(), asyncio.Event()

    async def prefix(_request: web.Request) -> web.Response:
        asked.set()
        await answer.wait()
        return web.json_response({"error": "not held"}, status=404)

    source_app = web.Application()
    source_app.router.add_get("/prefixfleet/prefix/{hash}", prefix)
    async with (
        serve_aiohttp(source_app) as source,
        serve_aiohttp(stand_in_engine()) as engine,
        listening(standalone_sidecar(engine)) as served,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://{LOOPBACK}:{served.port}"
        warm = asyncio.create_task(
            http.post(f"{url}/prefixfleet/warm", json={"source": source, "hashes": ["0123456789abcdef"]})
        )
        await asyncio.wait_for(asked.wait(), 30)
        assert served.sidecar.s.state == "warming"
        async with http.post(f"{url}/prefixfleet/state", json={"state": meanwhile}) as resp:
            assert resp.status == 200
        answer.set()
        async with await warm as resp:
            assert resp.status == 200
            assert (await resp.json())["state"] == meanwhile
        assert served.sidecar.s.state == meanwhile
