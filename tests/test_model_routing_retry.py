"""A retry of a request naming a model, when the only worker serving it fails: real Redis, a gateway
in process, member and load records written as a sidecar writes them; worker ``a`` (serving
``model-a``) refuses connections, worker ``b`` (serving ``model-b``) is a stand-in engine.

Specification:
* a request naming ``model-b`` goes to ``b``;
* a request naming ``model-a`` is never answered by ``b`` (its model is not the one asked for):
  once ``a`` failed, the client gets the gateway's error. A failed worker sits out for SUSPECT_S
  while others are fresh; the model is matched before suspects are set aside, so on the retry
  ``model-a`` is still served by ``a`` alone (before, the rule saw no routable worker listing it and
  fell back to every worker: ``b`` answered).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from fleet_fixtures import RedisServer, eventually, free_port, serve_aiohttp

from prefixfleet.router.gateway import GatewayConfig, Listening, listening
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.proxying import WORKER_HEADER
from prefixfleet.router.records import LoadReport, MemberRecord, encode_record

FLEET = "modelretry"
pytestmark = pytest.mark.timeout(60)


def load_record() -> str:
    return encode_record(
        LoadReport(
            seq=1, ts=time.time(), state="ready", engine_ok=True, in_flight=0, queued=0,
            pending_prefill_tokens=0, prefill_tokens_per_s=30000.0, cached_tokens=0,
            capacity_tokens=100000, summary_version=0,
        )
    )  # fmt: skip


@pytest.fixture
async def gateway(redis_server: RedisServer) -> AsyncIterator[tuple[Listening, list[str]]]:
    served: list[str] = []  # the model named by each request worker b answered

    async def completions(request: web.Request) -> web.Response:
        model = (await request.json()).get("model")
        served.append(model)
        return web.json_response({"object": "text_completion", "model": model, "choices": [{"text": "ok"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    async with serve_aiohttp(app) as b_url:
        keys = FleetKeys(FLEET)
        members = {
            "a": MemberRecord(url=f"http://127.0.0.1:{free_port()}", served_models=("model-a",)),  # refuses
            "b": MemberRecord(url=b_url, served_models=("model-b",)),
        }
        client = aioredis.from_url(redis_server.url)
        try:
            for wid, member in members.items():
                await client.hset(keys.members, wid, encode_record(member))
                await client.set(keys.load(wid), load_record())
        finally:
            await client.aclose()
        # records written once, never refreshed: a day before they count as dead
        config = GatewayConfig(
            port=0, redis_url=redis_server.url, fleet=FLEET, refresh_interval_s=0.05, dead_after_s=86400.0
        )
        async with listening(config) as served_gateway:
            view = served_gateway.gateway.view
            await eventually(lambda: len(view.routable(time.monotonic())) == 2, 20, "both workers routable")
            yield served_gateway, served


async def complete(port: int, model: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        body = {"model": model, "prompt": "hello there", "max_tokens": 2}
        async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status, resp.headers.get(WORKER_HEADER, "")


async def test_a_request_naming_the_other_model_goes_to_its_worker(
    gateway: tuple[Listening, list[str]],
) -> None:
    served_gateway, served = gateway
    assert await complete(served_gateway.port, "model-b") == (200, "b")
    assert served == ["model-b"]


async def test_once_the_models_only_worker_failed_another_models_worker_does_not_answer(
    gateway: tuple[Listening, list[str]],
) -> None:
    served_gateway, served = gateway
    status, _worker = await complete(served_gateway.port, "model-a")
    assert served == []  # b never saw it
    assert status in (502, 503)


async def test_once_the_models_only_worker_failed_its_model_card_is_not_asked_of_another(
    gateway: tuple[Listening, list[str]],
) -> None:
    """``GET /v1/models/{model}`` follows the same rule as generation: with ``a`` a suspect (its
    request failed), ``model-a``'s card is not asked of ``b``, which would answer 404 (no such model)
    for a model the fleet serves; the client gets the gateway's 503 (no worker serving it answered)."""
    served_gateway, _served = gateway
    status, _worker = await complete(served_gateway.port, "model-a")  # a refuses: now a suspect
    assert status in (502, 503)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{served_gateway.port}/v1/models/model-a") as resp,
    ):
        await resp.read()
        assert (resp.status, resp.headers.get(WORKER_HEADER)) == (503, None)
