"""A warm-up whose client left ends its hold on traffic and stops its prefills.

``POST /prefixfleet/warm`` (holding traffic) keeps the replica ``warming`` (gateways send it
nothing) while it replays the source's prefixes, each prefill allowed up to two minutes. When the
operator gives up on the request (its HTTP client times out, or it is restarted), nobody waits for
the answer any more: the replica must go back to ``ready`` at once (unless a drain was set
meanwhile) and the prefill in flight must be aborted, instead of the replica staying out of
rotation until every prefix was replayed. It does so through the handler cancellation of the
sidecar's aiohttp runner (router/front.py, fallback_runner): without it this test fails.

Real HTTP on 127.0.0.1: a stand-in source that hands out a prefix, a stand-in engine whose
``/generate`` holds the prefill until it sees its client leave, and the real sidecar being warmed.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, eventually, free_port, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)

HASHES = ["0123456789abcdef", "fedcba9876543210"]


@pytest.mark.parametrize("meanwhile", [None, "draining"])
async def test_a_warm_request_whose_client_left_releases_the_replica(meanwhile: str | None) -> None:
    prefilling, aborted = asyncio.Event(), asyncio.Event()
    prefills = 0

    async def prefix(request: web.Request) -> web.Response:
        sid = request.match_info["hash"]
        ids = [1, 2, 3, 4] if sid == HASHES[0] else [5, 6, 7, 8]
        identity = {"model": "m", "revision": "r", "adapter": ""}
        request = {"path": "/generate", "body": {"input_ids": ids}}  # a kept request of the client's ids
        return web.json_response({"hash": sid, "num_tokens": len(ids), "request": request, **identity})

    async def generate(request: web.Request) -> web.Response:
        nonlocal prefills
        prefills += 1
        await request.read()
        prefilling.set()
        try:
            await asyncio.Event().wait()  # held until the sidecar gives up on it
        except asyncio.CancelledError:
            aborted.set()  # the engine's side of an aborted request: its handler is cancelled
            raise
        raise AssertionError("unreachable")

    source_app = web.Application()
    source_app.router.add_get("/prefixfleet/prefix/{hash}", prefix)
    async with (
        serve_aiohttp(source_app) as source,
        serve_aiohttp(stand_in_engine({"/generate": generate}), handler_cancellation=True) as engine,
        # a real port: the warm-up replays each prefix to its own sidecar's /generate
        listening(standalone_sidecar(engine, port=free_port())) as served,
    ):
        url = f"http://{LOOPBACK}:{served.port}"
        sidecar = served.sidecar
        # the operator's client (httpx, as warm_replica sends it); a timeout there closes the
        # connection as this cancellation does
        async with httpx.AsyncClient() as operator:
            body = {"source": source, "hashes": HASHES}
            warm = asyncio.create_task(operator.post(f"{url}/prefixfleet/warm", json=body, timeout=None))
            await asyncio.wait_for(prefilling.wait(), 30)
            assert sidecar.s.state == "warming"
            if meanwhile is not None:
                state = {"state": meanwhile}
                async with (
                    aiohttp.ClientSession() as admin,
                    admin.post(f"{url}/prefixfleet/state", json=state) as resp,
                ):
                    assert resp.status == 200
            warm.cancel()  # the operator's client gives up: its connection closes
            with pytest.raises(asyncio.CancelledError):
                await warm
        # the operator's session is closed too: the connection is surely gone
        await eventually(lambda: sidecar.s.state != "warming", 30, "the warm-up's hold to end")
        assert sidecar.s.state == (meanwhile or "ready")
        await asyncio.wait_for(aborted.wait(), 30)  # the prefill in flight was aborted
        # and the prefixes left were not replayed
        await eventually(lambda: sidecar.s.load.in_flight == 0, 30, "no request in flight")
        assert prefills == 1
