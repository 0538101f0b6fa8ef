"""The emulator's ``--api-key``, as vLLM's and SGLang's (emulator/auth.py).

Specification (their sources, see docs/emulator.md): with a key, vLLM refuses every ``/v1*`` request
whose ``Authorization`` is not ``Bearer <one of its keys>`` (``--api-key`` takes several; unlike
vLLM the emulator does not read ``VLLM_API_KEY``) and leaves other paths open; SGLang refuses every
path but ``/health*`` and ``/metrics*`` (one key). Both skip OPTIONS, take the scheme in any case,
and answer 401 ``{"error": "Unauthorized"}``. A key no header can carry is refused at start. So the sidecar's
engine key (PREFIXFLEET_ENGINE_API_KEY) is tested against an engine that refuses: with it the
sidecar learns the engine through its probes; a client's own header passes unchanged.
Before: the emulator had no ``--api-key`` (an unrecognised argument) and refused nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fleet_fixtures import eventually, standalone_sidecar

from prefixfleet.cli import UsageError, build_parser
from prefixfleet.emulator import EmulatorConfig, EmulatorServer, SglangOptions, VllmOptions
from prefixfleet.emulator.auth import authorized, sglang_guarded, vllm_guarded
from prefixfleet.emulator.cli import config_from_args, sglang_options_from_args, vllm_options_from_args
from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.engine_api import SGLANG, VLLM
from prefixfleet.router.sidecar import ENGINE_API_KEY_ENV

pytestmark = pytest.mark.timeout(60)

KEY = "sk-emu-1"
UNAUTHORIZED = {"error": "Unauthorized"}
CACHE_TOKENS = 40_000


def parsed(*argv: str):
    return build_parser("emulator").parse_args(["emulator", "--port", "0", *argv])


def test_which_requests_need_the_key_on_each_face():
    ok = f"Bearer {KEY}"
    for header in (ok, f"bearer {KEY}", f"BEARER {KEY}"):
        assert authorized("POST", "/v1/completions", header, (KEY,), vllm_guarded)
    for header in (
        None,
        "",
        KEY,
        f"Basic {KEY}",
        f"Bearer {KEY} ",
        f"Bearer  {KEY}",
        "Bearer sk-emu-2",
        "Bearer é",
    ):
        assert not authorized("POST", "/v1/completions", header, (KEY,), vllm_guarded), header
        assert not authorized("POST", "/generate", header, (KEY,), sglang_guarded), header
    assert authorized("POST", "/v1/completions", "Bearer other", ("other", KEY), vllm_guarded)  # any key
    # vLLM guards /v1* only; SGLang every path but /health* and /metrics*
    for path in ("/health", "/metrics", "/tokenize", "/version"):
        assert authorized("GET", path, None, (KEY,), vllm_guarded)
    for path in ("/health", "/health_generate", "/metrics"):
        assert authorized("GET", path, None, (KEY,), sglang_guarded)
    for path in ("/get_server_info", "/v1/models", "/flush_cache", "/nowhere"):
        assert not authorized("GET", path, None, (KEY,), sglang_guarded)
    assert authorized("OPTIONS", "/v1/completions", None, (KEY,), vllm_guarded)
    assert authorized("POST", "/v1/completions", None, (), vllm_guarded)  # no key: open


def test_the_flag_and_the_environment_as_each_engine_reads_them():
    args = parsed("--api", "vllm", "--api-key", "a", "b")
    assert vllm_options_from_args(args, config_from_args(args), {}).api_keys == ("a", "b")
    # vLLM reads VLLM_API_KEY too; the emulator does not: a client's VLLM_API_KEY in the shell would
    # key every emulator `prefixfleet up` starts, whose sidecars carry no key
    args = parsed("--api", "vllm")
    assert vllm_options_from_args(args, config_from_args(args), {"VLLM_API_KEY": "e"}).api_keys == ()
    args = parsed("--api", "vllm", "--api-key", "a", "")  # an empty key is dropped, as vLLM drops it
    assert vllm_options_from_args(args, config_from_args(args), {}).api_keys == ("a",)
    assert sglang_options_from_args(parsed("--api-key", "k")) == SglangOptions(api_key="k")
    assert "k" not in repr(sglang_options_from_args(parsed("--api-key", "k")))  # kept out of logs
    assert sglang_options_from_args(parsed("--api-key", "")).api_key is None  # SGLang: no key
    with pytest.raises(UsageError, match="--api-key takes one key with --api sglang"):
        sglang_options_from_args(parsed("--api-key", "a", "b"))
    with pytest.raises(UsageError, match="--api-key has a control character"):
        sglang_options_from_args(parsed("--api-key", "k\n"))
    args = parsed("--api", "vllm", "--api-key", "a", "k\n")
    with pytest.raises(UsageError, match="--api-key has a control character"):
        vllm_options_from_args(args, config_from_args(args), {})


@contextlib.asynccontextmanager
async def keyed(api: str) -> AsyncIterator[str]:
    config = EmulatorConfig(time_scale=200.0, cache_tokens=CACHE_TOKENS, model="keyed-model")
    if api == VLLM:
        server = EmulatorServer(config, vllm=VllmOptions(api_keys=("other", KEY)))
    else:
        server = EmulatorServer(config, sglang=SglangOptions(api_key=KEY))
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()


async def answer(
    http: aiohttp.ClientSession, method: str, url: str, key: str | None, **kw: Any
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with http.request(method, url, headers=headers, **kw) as r:
        return r.status, await r.json() if r.content_type == "application/json" else None


COMPLETION = {"prompt": "a b c", "max_tokens": 1}


@pytest.mark.parametrize("api", [VLLM, SGLANG])
async def test_a_keyed_emulator_refuses_as_the_engine_does(api: str) -> None:
    async with keyed(api) as url, aiohttp.ClientSession() as http:
        for key in (None, "wrong"):
            assert await answer(http, "POST", url + "/v1/completions", key, json=COMPLETION) == (
                401,
                UNAUTHORIZED,
            )
            assert await answer(http, "GET", url + "/v1/models", key) == (401, UNAUTHORIZED)
            assert await answer(http, "GET", url + "/v1/nowhere", key) == (401, UNAUTHORIZED)
        status, body = await answer(http, "POST", url + "/v1/completions", KEY, json=COMPLETION)
        assert status == 200 and body["usage"]["completion_tokens"] == 1
        assert (await answer(http, "GET", url + "/health", None))[0] == 200
        assert (await answer(http, "GET", url + "/metrics", None))[0] == 200
        if api == SGLANG:
            gen = {"text": "a b c", "sampling_params": {"max_new_tokens": 1}}
            assert await answer(http, "POST", url + "/generate", None, json=gen) == (401, UNAUTHORIZED)
            assert await answer(http, "GET", url + "/get_server_info", None) == (401, UNAUTHORIZED)
            assert (await answer(http, "GET", url + "/health_generate", None))[0] == 200
            assert (await answer(http, "POST", url + "/generate", KEY, json=gen))[0] == 200
        else:
            assert (await answer(http, "POST", url + "/tokenize", None, json={"prompt": "a b"}))[0] == 200
            assert (await answer(http, "POST", url + "/v1/completions", "other", json=COMPLETION))[0] == 200


@pytest.mark.parametrize("api", [VLLM, SGLANG])
async def test_the_sidecar_with_the_engine_key_learns_a_keyed_emulator(
    api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENGINE_API_KEY_ENV, KEY)
    async with keyed(api) as engine, aiohttp.ClientSession() as http:
        asked = {"model": None, "revision": None, "cache_tokens": None}  # learned from the engine
        async with sidecar_module.listening(standalone_sidecar(engine, **asked)) as served:
            car = served.sidecar
            await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the keyed engine")
            assert (car.s.engine.api, car.s.engine.model) == (api, "keyed-model")
            assert car.load_report().capacity_tokens == CACHE_TOKENS
            sidecar = f"http://127.0.0.1:{served.port}"
            # a client's own header is passed on as it came: the sidecar's key opens no way around
            assert await answer(http, "POST", sidecar + "/v1/completions", None, json=COMPLETION) == (
                401,
                UNAUTHORIZED,
            )
            status, body = await answer(http, "POST", sidecar + "/v1/completions", KEY, json=COMPLETION)
            assert status == 200, body


async def test_the_sidecar_without_the_key_does_not_learn_a_keyed_emulator(monkeypatch) -> None:
    monkeypatch.delenv(ENGINE_API_KEY_ENV, raising=False)
    async with keyed(SGLANG) as engine:
        asked = {"model": None, "revision": None, "cache_tokens": None}
        async with sidecar_module.listening(standalone_sidecar(engine, **asked)) as served:
            car = served.sidecar
            await eventually(lambda: car._refused_warned, 20, "the sidecar to see its probes refused")
            # refused: the engine's model and capacity stay unknown
            assert (car.s.engine.model, car.s.engine.capacity_tokens) == ("", None)


def test_an_emulator_given_both_apis_options_is_refused() -> None:
    # one server speaks one API: SGLang options beside vLLM ones would be silently ignored
    with pytest.raises(ValueError, match="one API"):
        EmulatorServer(EmulatorConfig(), vllm=VllmOptions(), sglang=SglangOptions(api_key="k"))
