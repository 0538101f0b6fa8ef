"""Detecting the engine's API (``--engine-api auto``) reads SGLang's ``/get_server_info`` once.

The detection probe asks ``/get_server_info`` to tell SGLang from vLLM; for an SGLang engine that
answer is also the server info its identity and capacity come from, so learning the engine (at
start and at each restart) asks it once, not once to detect and again to read.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp, standalone_sidecar

from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.engine_api import AUTO, SGLANG

pytestmark = pytest.mark.timeout(60)


def counting_sglang(hits: Counter[str]) -> web.Application:
    async def server_info(_request: web.Request) -> web.Response:
        hits["/get_server_info"] += 1
        return web.json_response({"served_model_name": "sg-model", "max_total_num_tokens": 5000})

    async def model_info(_request: web.Request) -> web.Response:
        hits["/get_model_info"] += 1
        return web.json_response({"model_path": "/models/sg", "revision": "rev1"})

    app = web.Application()
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/get_model_info", model_info)
    return app


@pytest.mark.parametrize("engine_api", [AUTO, SGLANG])
async def test_learning_an_sglang_engine_asks_its_server_info_once(engine_api: str) -> None:
    hits: Counter[str] = Counter()
    async with serve_aiohttp(counting_sglang(hits)) as engine_url:
        settings: dict[str, Any] = {"model": None, "revision": None, "cache_tokens": None}
        car = sidecar_module.Sidecar(standalone_sidecar(engine_url, engine_api=engine_api, **settings))
        # the engine watch is not started: only this call asks the engine anything
        async with aiohttp.ClientSession() as session:
            car.session = session
            await car._fetch_engine_info()
    e = car.s.engine
    assert (e.known, e.api, e.model, e.revision) == (True, SGLANG, "sg-model", "rev1")
    assert car.s.mirror.tree.capacity_tokens == 5000
    assert hits == Counter({"/get_server_info": 1, "/get_model_info": 1})
