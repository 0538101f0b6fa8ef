"""The sidecar in front of an engine run with an API key, against small fake engines that require it.

Specification (engines' behaviour checked in their sources: vLLM's api_server ``authentication``
middleware refuses any ``/v1`` path whose ``Authorization`` is not ``Bearer <key>`` with a 401, other
paths open; SGLang's ``add_api_key_middleware`` does the same on every path but ``/health*`` and
``/metrics*``):
* the sidecar reads its engine's key from ``PREFIXFLEET_ENGINE_API_KEY`` and sends
  ``Authorization: Bearer <key>`` on the requests it originates (identity and capacity probes,
  health, metrics, pre-warm replays), so against a keyed engine it learns the API, model and
  capacity, and pre-warming warms;
* without the key, an engine refusing its probes (401/403) is said once, in a warning naming
  ``PREFIXFLEET_ENGINE_API_KEY``;
* a client's request carries the client's own ``Authorization``, unchanged: the sidecar's key is
  never put on it (nor replaces it), so the sidecar opens no way around the engine's key;
* a key no header can carry (e.g. with a Secret file's trailing newline) is refused at start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, free_port, serve_aiohttp, standalone_sidecar

from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.blockhash import CacheIdentity, block_hashes
from prefixfleet.router.engine_api import SGLANG, VLLM
from prefixfleet.router.sidecar import ENGINE_API_KEY_ENV, engine_auth
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

KEY = "sk-engine-123"
SERVED = "served-model"
BLOCK = 16
CAPACITY = {VLLM: BLOCK * 100, SGLANG: 5000}
PROMPT = "the quick brown fox jumps over the lazy dog and keeps on running " * 8


@dataclass
class KeyedEngine:
    """A fake engine speaking ``api`` that requires ``Bearer KEY`` where the real one does; it
    records the Authorization of every request it served and the prompts it prefilled."""

    api: str
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    prompts: list[Any] = field(default_factory=list)

    def guarded(self, path: str) -> bool:
        if self.api == VLLM:
            return path.startswith("/v1")
        return not path.startswith(("/health", "/metrics"))

    def app(self) -> web.Application:
        @web.middleware
        async def authentication(request: web.Request, handler: Any) -> web.StreamResponse:
            auth = request.headers.get("Authorization")
            self.seen.append((request.path, auth))
            if self.guarded(request.path) and auth != f"Bearer {KEY}":
                return web.json_response({"error": "Unauthorized"}, status=401)
            return await handler(request)

        app = web.Application(middlewares=[authentication])
        app.router.add_get("/health", self.ok)
        if self.api == VLLM:
            app.router.add_get("/v1/models", self.models)
            app.router.add_get("/metrics", self.metrics)
            app.router.add_post("/v1/completions", self.complete)
        else:
            app.router.add_get("/get_server_info", self.server_info)
            app.router.add_get("/get_model_info", self.model_info)
            app.router.add_post("/generate", self.generate)
        return app

    async def ok(self, _request: web.Request) -> web.Response:
        return web.Response()

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": SERVED, "object": "model"}]})

    async def metrics(self, _request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{BLOCK}",engine="0",num_gpu_blocks="100"}} 1.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def server_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"served_model_name": SERVED, "max_total_num_tokens": CAPACITY[SGLANG]})

    async def model_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"model_path": "/models/x"})

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.prompts.append(body["prompt"])
        n = len(tokenize(body["prompt"])) if isinstance(body["prompt"], str) else len(body["prompt"])
        usage = {"prompt_tokens": n, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
        return web.json_response({"choices": [{"index": 0, "text": " ok"}], "usage": usage})

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("text", body.get("input_ids"))
        self.prompts.append(prompt)
        n = len(tokenize(prompt)) if isinstance(prompt, str) else len(prompt)
        return web.json_response({"text": " ok", "meta_info": {"prompt_tokens": n, "cached_tokens": 0}})


@contextlib.asynccontextmanager
async def keyed_sidecar(
    engine: KeyedEngine, *, wait: bool = True, **settings: Any
) -> AsyncIterator[tuple[str, sidecar_module.Sidecar]]:
    """The fake engine and a sidecar in front of it (no Redis, ``--engine-api auto``, the key from
    the environment as the pod sets it), once the sidecar knows the engine when ``wait``."""
    async with serve_aiohttp(engine.app()) as engine_url:
        asked = {"model": None, "revision": None, "cache_tokens": None}  # from the engine
        config = standalone_sidecar(engine_url, **asked | settings)
        async with sidecar_module.listening(config) as served:
            car = served.sidecar
            if wait:
                await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
            yield f"http://127.0.0.1:{served.port}", car


def client_request(api: str) -> tuple[str, dict[str, Any]]:
    if api == VLLM:
        return "/v1/completions", {"model": SERVED, "prompt": PROMPT, "max_tokens": 1}
    return "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}}


@pytest.mark.parametrize("api", [VLLM, SGLANG])
async def test_with_the_key_the_sidecar_learns_the_engine_and_prewarm_warms(
    api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENGINE_API_KEY_ENV, KEY)
    holder_engine, cold_engine = KeyedEngine(api), KeyedEngine(api)
    async with (
        keyed_sidecar(holder_engine) as (holder, holder_car),
        keyed_sidecar(cold_engine, port=free_port()) as (cold, cold_car),  # the replay needs its port
        aiohttp.ClientSession() as http,
    ):
        for car in (holder_car, cold_car):
            assert (car.s.engine.api, car.s.engine.model) == (api, SERVED)
            assert car.load_report().capacity_tokens == CAPACITY[api]
        path, body = client_request(api)
        client_auth = {"Authorization": f"Bearer {KEY}"}
        async with http.post(f"{holder}{path}", json=body, headers=client_auth) as resp:
            assert resp.status == 200, await resp.text()
        seed = CacheIdentity(SERVED, "", "").seed()
        last = f"{block_hashes(tokenize(PROMPT), seed, holder_car.s.mirror.block_tokens)[-1]:016x}"
        warm = {"source": holder, "hashes": [last], "hold_traffic": False}
        async with http.post(f"{cold}/prefixfleet/warm", json=warm) as resp:  # no key: the autoscaler's call
            assert resp.status == 200, await resp.text()
            result = await resp.json()
        assert result["results"][last]["status"] == "ok", result
        assert cold_engine.prompts == [PROMPT]  # the replay reached the engine, keyed by the sidecar
        assert cold_car.s.mirror.tree.cached_tokens > 0
        # every request to either engine carried the key: none was refused
        for engine in (holder_engine, cold_engine):
            assert {auth for _path, auth in engine.seen} == {f"Bearer {KEY}"}
        # the source sidecar was asked for the prefix without the engine key
        assert not any("prefixfleet" in p for p, _a in holder_engine.seen)


@pytest.mark.parametrize("api", [VLLM, SGLANG])
async def test_a_clients_own_authorization_passes_unchanged(
    api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENGINE_API_KEY_ENV, KEY)
    engine = KeyedEngine(api)
    async with keyed_sidecar(engine) as (url, _car), aiohttp.ClientSession() as http:
        path, body = client_request(api)
        statuses = []
        for auth in ("Bearer client-key", None):
            engine.seen.clear()
            headers = {"Authorization": auth} if auth else {}
            async with http.post(f"{url}{path}", json=body, headers=headers) as resp:
                statuses.append(resp.status)
            # the engine saw the client's header as sent, never the sidecar's key in its place
            assert (path, auth) in engine.seen
            assert (path, f"Bearer {KEY}") not in engine.seen
        assert statuses == [401, 401]  # the engine's refusal, passed on: the sidecar opens no bypass


@pytest.mark.parametrize("api", [VLLM, SGLANG])
async def test_without_the_key_one_warning_names_the_variable(
    api: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ENGINE_API_KEY_ENV, raising=False)
    caplog.set_level(logging.WARNING, logger=sidecar_module.log.name)
    engine = KeyedEngine(api)
    async with keyed_sidecar(engine, wait=False):
        await eventually(lambda: len(engine.seen) >= 6, 20, "several rounds of probes")
        # Unkeyed: the sidecar learns no capacity from a refusing engine, so it keeps its default.
        warnings = [r.getMessage() for r in caplog.records if ENGINE_API_KEY_ENV in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "requires an API key" in warnings[0]
        assert all(auth is None for _path, auth in engine.seen)


async def test_a_wrong_key_is_said_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(ENGINE_API_KEY_ENV, "not-the-key")
    caplog.set_level(logging.WARNING, logger=sidecar_module.log.name)
    engine = KeyedEngine(VLLM)
    async with keyed_sidecar(engine, wait=False):
        await eventually(lambda: any(p == "/v1/models" for p, _a in engine.seen), 20, "the models probe")
        await eventually(
            lambda: any(ENGINE_API_KEY_ENV in r.getMessage() for r in caplog.records), 20, "the warning"
        )
        warning = next(r.getMessage() for r in caplog.records if ENGINE_API_KEY_ENV in r.getMessage())
        assert "refused the key" in warning
        assert "not-the-key" not in warning  # the key itself never reaches a log


def test_engine_auth() -> None:
    assert engine_auth(None) == engine_auth("") == {}
    assert engine_auth(KEY) == {"Authorization": f"Bearer {KEY}"}
    for bad in (KEY + "\n", "a b", "kéy"):
        with pytest.raises(ValueError, match=ENGINE_API_KEY_ENV):
            engine_auth(bad)


def test_the_key_is_not_in_the_configs_repr() -> None:
    config = standalone_sidecar("http://127.0.0.1:1", engine_api_key=KEY)
    assert KEY not in repr(config)
    assert sidecar_module.Sidecar(config).engine_headers == {"Authorization": f"Bearer {KEY}"}
