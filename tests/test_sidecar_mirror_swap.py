"""A request admitted to the sidecar's mirror before the mirror was replaced, ending in error.

The sidecar starts with a mirror named by its configured cache identity and replaces it when the
engine names another one (``/get_server_info`` at start-up, or after the engine came back from an
outage). A generation request admitted into the old mirror and ending before the engine's first
token (an error answer, a client that left) withdraws the tokens it added: from the mirror it was
admitted to. Taken from the new mirror, the old tree's leaf was detached from it, which counted
the leaf's tokens off a tree that never held them: ``cached_tokens`` went negative, the load
record carried it, and gateways refuse a load record with a negative number, so the worker left
routing for good.

Real HTTP on 127.0.0.1: a stand-in engine whose ``/get_server_info`` answers only when the test
says (so a request is in flight when the identity arrives), the real sidecar (``listening``).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, eventually, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.records import decode_load, encode_record
from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)


async def test_a_request_admitted_before_the_mirror_was_replaced_withdraws_from_its_own():
    info_gate, generate_gate, arrived = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def server_info(_request: web.Request) -> web.Response:
        await info_gate.wait()
        info = {"served_model_name": "m2", "revision": "r2", "max_total_num_tokens": 50_000}
        return web.json_response(info)

    async def generate(_request: web.Request) -> web.Response:
        arrived.set()
        await generate_gate.wait()
        return web.json_response({"error": {"message": "engine overloaded"}}, status=503)

    app = stand_in_engine({"/generate": generate}, {"/get_server_info": server_info})
    async with serve_aiohttp(app) as engine:
        config = standalone_sidecar(engine, model=None, revision=None, cache_tokens=None)
        async with listening(config) as served, aiohttp.ClientSession() as http:
            sidecar = served.sidecar
            prompt = " ".join(f"word{i}" for i in range(100))
            body = {"text": prompt, "sampling_params": {"max_new_tokens": 4}}
            url = f"http://{LOOPBACK}:{served.port}/generate"
            request = asyncio.create_task(http.post(url, json=body))
            await asyncio.wait_for(arrived.wait(), 30)
            # admitted (tokenized while the engine works) into the mirror of the configured identity
            await eventually(lambda: sidecar.s.mirror.tree.cached_tokens > 0, 30, "the prompt admitted")
            info_gate.set()
            await eventually(lambda: sidecar.s.mirror.identity.model == "m2", 30, "the engine's identity")
            generate_gate.set()
            async with await request as resp:
                assert resp.status == 503
            await eventually(lambda: sidecar.s.load.in_flight == 0, 30, "the request to finish")
            tree = sidecar.s.mirror.tree
            assert tree.cached_tokens == 0 and tree.node_count == 0
            decode_load(encode_record(sidecar.load_report()))  # what a gateway reads: not refused
