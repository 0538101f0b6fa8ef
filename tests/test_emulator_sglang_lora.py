"""The SGLang emulator's LoRA adapters, as SGLang serves them (emulator/sglang_options.py).

Specification (SGLang's sources, see docs/emulator.md): ``--lora-paths`` entries are ``PATH``,
``NAME=PATH`` or JSON ``{"lora_name", "lora_path", "pinned"}`` and turn ``--enable-lora`` on; a
request names an adapter by ``lora_path`` (``/generate``, and the OpenAI bodies) or by ``model:
"base:NAME"`` on the OpenAI routes, and is cached under it (the same prompt under another adapter
or the base model is a miss); an adapter not loaded is a 400 in SGLang's words; without
``--enable-lora`` ``lora_path`` is ignored. ``/v1/models`` lists each adapter with its ``parent``,
``/get_server_info`` states ``enable_lora`` and ``lora_paths`` (the sidecar reads adapters there),
``/load_lora_adapter`` and ``/unload_lora_adapter`` answer as SGLang's.
Before: ``--enable-lora``/``--lora-paths`` were refused with ``--api sglang`` and ``lora_path``
ignored, so every adapter's requests shared one cache.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from prefixfleet.cli import UsageError, build_parser
from prefixfleet.emulator import EmulatorConfig, EmulatorServer
from prefixfleet.emulator.cli import config_from_args, sglang_options_from_args, vllm_options_from_args
from prefixfleet.emulator.sglang_options import LoraRef, SglangOptions, parse_lora_path, requested_adapters
from prefixfleet.router.engine_api import sglang_adapter_names

pytestmark = pytest.mark.timeout(60)

PROMPT = "lora test " + " ".join(f"w{i}" for i in range(60))
LORAS = (LoraRef("A", "/loras/a"), LoraRef("B", "/loras/b"))


def parsed(*argv: str):
    return build_parser("emulator").parse_args(["emulator", "--port", "0", *argv])


def test_lora_paths_are_read_as_sglang_reads_them():
    assert parse_lora_path("/loras/sql") == LoraRef("/loras/sql", "/loras/sql")
    assert parse_lora_path("sql=/loras/s=1") == LoraRef("sql", "/loras/s=1")
    assert parse_lora_path(' {"lora_name": "x", "lora_path": "/p", "pinned": true} ') == LoraRef(
        "x", "/p", True
    )


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("=/p", "expected PATH, NAME=PATH or a JSON object"),
        ("a=", "expected PATH, NAME=PATH or a JSON object"),
        ("{nope}", "looks like JSON but is not valid JSON"),
        ('{"lora_name": "a"}', "does not contain 'lora_name' and 'lora_path' keys"),
        ('{"lora_name": "", "lora_path": "/p"}', "must be non-empty strings"),
        ('{"lora_name": "a", "lora_path": "/p", "pinned": "yes"}', "pinned must be true or false"),
    ],
)
def test_a_bad_lora_path_is_one_line_naming_it(item, said):
    with pytest.raises(ValueError, match=said):
        parse_lora_path(item)
    with pytest.raises(UsageError, match=said):
        sglang_options_from_args(parsed("--lora-paths", item))


def test_the_flags_belong_to_their_engine():
    options = sglang_options_from_args(parsed("--lora-paths", "A=/a", "/b"))
    assert options is not None and options.enable_lora  # --lora-paths turns it on, as in SGLang
    assert [r.name for r in options.lora_paths] == ["A", "/b"]
    assert sglang_options_from_args(parsed("--enable-lora")) == SglangOptions(enable_lora=True)
    with pytest.raises(UsageError, match="names an adapter twice: A"):
        sglang_options_from_args(parsed("--lora-paths", "A=/a", "A=/b"))
    args = parsed("--lora-modules", "A=/a")
    with pytest.raises(UsageError, match="--lora-modules is vLLM's flag; with --api sglang use --lora-paths"):
        vllm_options_from_args(args, config_from_args(args))
    args = parsed("--api", "vllm", "--lora-paths", "A=/a")
    with pytest.raises(UsageError, match="--lora-paths is SGLang's flag; with --api vllm use --lora-modules"):
        vllm_options_from_args(args, config_from_args(args))
    assert sglang_options_from_args(args) is None


def test_a_request_names_its_adapter_by_base_colon_name_or_lora_path():
    assert requested_adapters({"model": "m:A", "lora_path": "B"}, 1, False, openai=True) == (("A",), "model")
    assert requested_adapters({"model": "m:", "lora_path": "B"}, 1, False, openai=True) == (
        ("B",),
        "lora_path",
    )
    assert requested_adapters({"model": "A"}, 1, False, openai=True) == ((None,), "lora_path")
    # /generate's GenerateReqInput has no model field: base:A there names nothing (as the router
    # hashes it, router/requests.py adapter_model)
    assert requested_adapters({"model": "m:A"}, 1, False, openai=False) == ((None,), "lora_path")
    assert requested_adapters({"lora_path": ["A", None]}, 2, True, openai=False) == (("A", None), "lora_path")
    # a number; a list of another length than the batch; a non-string entry; a list for one prompt
    for bad, prompts, batch in ((5, 1, False), (["A"], 2, True), (["A", 1], 2, True), (["A"], 1, False)):
        with pytest.raises(ValueError, match="lora_path must be a string"):
            requested_adapters({"lora_path": bad}, prompts, batch, openai=False)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def serving(options: SglangOptions) -> EmulatorServer:
    return await EmulatorServer(EmulatorConfig(time_scale=200.0, cache_tokens=40_000), sglang=options).start()


async def generate(http: aiohttp.ClientSession, url: str, **extra: object) -> tuple[int, dict]:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}, **extra}
    async with http.post(url + "/generate", json=body) as r:
        return r.status, await r.json()


async def cached(http: aiohttp.ClientSession, url: str, **extra: object) -> int:
    status, answer = await generate(http, url, **extra)
    assert status == 200, answer
    return answer["meta_info"]["cached_tokens"]


async def test_each_adapter_has_its_own_cache_and_an_unknown_one_is_refused(http):
    server = await serving(SglangOptions(lora_paths=LORAS))
    try:
        url = server.url
        assert await cached(http, url, lora_path="A") == 0
        assert await cached(http, url, lora_path="A") > 0  # the repeat is a hit under A
        assert await cached(http, url, lora_path="B") == 0  # another adapter: a miss
        assert await cached(http, url) == 0  # the base model: a miss
        async with http.post(
            url + "/v1/completions", json={"model": "emulated-llm:B", "prompt": PROMPT, "max_tokens": 1}
        ) as r:
            assert r.status == 200
        assert await cached(http, url, lora_path="B") > 0  # base:B named B
        status, refused = await generate(http, url, lora_path="C")
        assert status == 400
        loaded = "odict_keys(['A', 'B'])"  # SGLang prints its registry's keys
        assert refused["error"]["message"] == (
            f"The following requested LoRA adapters are not loaded: C\nLoaded adapters: {loaded}."
        )
        async with http.post(url + "/v1/chat/completions", json={
            "model": "m:C", "messages": [{"role": "user", "content": "hi"}]
        }) as r:  # fmt: skip
            assert r.status == 400 and (await r.json())["error"]["param"] == "model"
        async with http.get(url + "/v1/models") as r:
            cards = (await r.json())["data"]
        assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
            ("emulated-llm", "emulated-llm", None),
            ("A", "/loras/a", "emulated-llm"),
            ("B", "/loras/b", "emulated-llm"),
        ]
        async with http.get(url + "/get_server_info") as r:
            info = await r.json()
        assert info["enable_lora"] is True
        assert sglang_adapter_names(info["lora_paths"]) == ["A", "B"]  # as the sidecar reads them
    finally:
        await server.stop()


async def test_without_enable_lora_lora_path_is_ignored_as_sglang_ignores_it(http):
    server = await serving(SglangOptions())
    try:
        assert await cached(http, server.url, lora_path="A") == 0
        assert await cached(http, server.url, lora_path="unknown") > 0  # no adapter: the base's cache
        async with http.get(server.url + "/v1/models") as r:
            assert len((await r.json())["data"]) == 1
        async with http.post(
            server.url + "/load_lora_adapter", json={"lora_name": "C", "lora_path": "/c"}
        ) as r:
            assert r.status == 400
            assert (await r.json())["error_message"] == (
                "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
            )
    finally:
        await server.stop()


async def test_adapters_load_and_unload_at_run_time_as_sglang_answers(http):
    server = await serving(SglangOptions(enable_lora=True))
    try:
        url = server.url
        assert (await generate(http, url, lora_path="C"))[0] == 400
        async with http.post(url + "/load_lora_adapter", json={"lora_name": "C", "lora_path": "/c"}) as r:
            assert (r.status, await r.json()) == (
                200,
                {"success": True, "error_message": None, "loaded_adapters": {"C": "/c"}},
            )
        async with http.post(url + "/load_lora_adapter", json={"lora_name": "C", "lora_path": "/c"}) as r:
            assert r.status == 400 and "LoRA with name C already exists" in (await r.json())["error_message"]
        assert await cached(http, url, lora_path="C") == 0
        assert await cached(http, url, lora_path="C") > 0
        async with http.post(url + "/unload_lora_adapter", json={"lora_name": "C"}) as r:
            assert (r.status, (await r.json())["loaded_adapters"]) == (200, {})
        async with http.post(url + "/unload_lora_adapter", json={"lora_name": "C"}) as r:
            assert r.status == 400 and "LoRA with name C does not exist" in (await r.json())["error_message"]
        async with http.post(url + "/unload_lora_adapter", json=["C"]) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "body"
        assert (await generate(http, url, lora_path="C"))[0] == 400
    finally:
        await server.stop()
