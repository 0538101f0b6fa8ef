"""Cached tokens in OpenAI answers: reported as SGLang reports them, read as the sidecar must read them.

Specification (SGLang's usage_processor.py, server_args.py; vLLM's serving code):
* SGLang's /v1/completions and /v1/chat/completions usage carries ``prompt_tokens_details``
  ``{"cached_tokens": N}`` only when it runs with --enable-cache-report, and then only when N > 0
  (``null`` otherwise); /generate's ``meta_info.cached_tokens`` is always there. The emulator does
  the same, and says ``enable_cache_report`` in /get_server_info as SGLang does;
* the operator starts SGLang (and emulator) engines with --enable-cache-report and vLLM ones with
  --enable-prompt-tokens-details (vLLM's counterpart), once however the spec wrote them; the local
  fleet starts its emulators with it: the sidecar corrects its mirror from the engine's counts;
* for the sidecar a usage without ``cached_tokens`` is unknown (no correction), never 0 — except
  from an engine whose server info says enable_cache_report, where it is 0 (SGLang leaves a 0 out).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from fleet_fixtures import eventually, standalone_sidecar

from prefixfleet.emulator.cli import config_from_args
from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer
from prefixfleet.fleet.local import EngineSettings, emulator_argv
from prefixfleet.operator import models, planner
from prefixfleet.router.proxying import answer_uncached_tokens, find_cached_tokens
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.sidecar import listening
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(60)

PROMPT = " ".join(f"alpha{i}" for i in range(60))
OTHER = " ".join(f"bravo{i}" for i in range(80))  # shares no prefix with PROMPT


def _engine_args(kind: str, args: list[str]) -> list[str]:
    spec = models.validate_spec({"model": {"name": "m"}, "engine": {"kind": kind, "args": args}})
    return planner.engine_command(spec)[1]


@pytest.mark.parametrize("given", [[], ["--enable-cache-report"], ["--tp", "2", "--enable-cache-report"]])
@pytest.mark.parametrize("kind", ["sglang", "emulator"])
def test_sglang_and_emulator_engines_report_cached_tokens_once(kind: str, given: list[str]) -> None:
    args = _engine_args(kind, given)
    assert args.count("--enable-cache-report") == 1
    if kind == "sglang":
        assert args.count("--enable-metrics") == 1


@pytest.mark.parametrize(
    ("given", "on", "off"),
    [
        ([], 1, 0),
        (["--enable-prompt-tokens-details"], 1, 0),
        (["--no-enable-prompt-tokens-details"], 0, 1),  # the spec opts out: respected
    ],
)
def test_vllm_engines_get_their_own_flag_for_cached_tokens(given: list[str], on: int, off: int) -> None:
    args = _engine_args("vllm", given)
    assert args.count("--enable-prompt-tokens-details") == on
    assert args.count("--no-enable-prompt-tokens-details") == off
    assert "--enable-cache-report" not in args  # SGLang's flag: vLLM's parser would refuse it


def test_the_local_fleet_starts_its_emulators_reporting_cached_tokens() -> None:
    argv = emulator_argv(1234, EngineSettings())
    assert argv.count("--enable-cache-report") == 1
    assert config_from_args(_emulator_namespace(argv)).enable_cache_report is True


def _emulator_namespace(argv: list[str]) -> Any:
    from prefixfleet.cli import build_parser

    words = argv[argv.index("emulator") :]
    return build_parser("emulator").parse_args(words)


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _streamed_usage(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    usages = []
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            data = line.strip().removeprefix(b"data: ")
            if data and data != b"[DONE]" and json.loads(data).get("usage"):
                usages.append(json.loads(data)["usage"])
    assert len(usages) == 1
    return usages[0]


@pytest.mark.parametrize("report", [False, True], ids=["default", "enable-cache-report"])
async def test_the_emulator_reports_openai_cached_tokens_as_sglang_does(report: bool) -> None:
    config = EmulatorConfig(time_scale=1000.0, enable_cache_report=report)
    async with EmulatorServer(config) as engine, aiohttp.ClientSession() as http:
        info = await (await http.get(f"{engine.url}/get_server_info")).json()
        assert info["enable_cache_report"] is report
        completion = {"prompt": PROMPT, "max_tokens": 1}
        chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}
        cold = await _post(http, f"{engine.url}/v1/completions", completion)
        assert cold["usage"]["prompt_tokens_details"] is None  # 0 cached: null even when reporting
        answers = [
            (await _post(http, f"{engine.url}/v1/completions", completion))["usage"],
            await _streamed_usage(http, f"{engine.url}/v1/completions", completion),
            (await _post(http, f"{engine.url}/v1/chat/completions", chat))["usage"],
            await _streamed_usage(http, f"{engine.url}/v1/chat/completions", chat),
            (await _post(http, f"{engine.url}/v1/chat/completions", chat))["usage"],
        ]
        for usage in answers[:2] + answers[4:]:  # the second chat is a hit on the first
            details = usage["prompt_tokens_details"]
            if report:
                assert details["cached_tokens"] > 0
            else:
                assert details is None
        # /generate reports them always, 0 included (SGLang's meta_info)
        generate = await _post(
            http, f"{engine.url}/generate", {"text": OTHER, "sampling_params": {"max_new_tokens": 1}}
        )
        assert generate["meta_info"]["cached_tokens"] == 0


def test_a_usage_without_cached_tokens_is_unknown_unless_the_engine_reports_them() -> None:
    without = (
        b'{"usage":{"prompt_tokens":61,"completion_tokens":1,"total_tokens":62,"prompt_tokens_details":null}}'
    )
    hit = b'{"usage":{"prompt_tokens":61,"total_tokens":62,"prompt_tokens_details":{"cached_tokens":60}}}'
    chunk = b'data: {"id":"x","choices":[{"index":0,"text":"a"}],"usage":null}\n\n'
    error = b'{"object":"error","message":"bad","type":"BadRequestError","code":400}'
    assert find_cached_tokens(without) is None
    assert answer_uncached_tokens("/v1/completions", without, 61) is None
    assert find_cached_tokens(without, absent_is_zero=True) == 0
    assert answer_uncached_tokens("/v1/completions", without, 5, absent_is_zero=True) == 61
    for known in (False, True):
        assert find_cached_tokens(hit, absent_is_zero=known) == 60
        # no usage at all (a token event, an error) is unknown either way
        assert find_cached_tokens(chunk, absent_is_zero=known) is None
        assert find_cached_tokens(error, absent_is_zero=known) is None


async def _mirror_after_a_miss_it_predicted_as_a_hit(report: bool, stream: bool) -> dict[str, int]:
    """The sidecar's mirror counters after one /v1/completions whose prompt the mirror holds but the
    engine does not (the engine holds as many tokens of another prompt, so the sidecar's periodic
    reconciliation of totals evicts nothing)."""
    config = EmulatorConfig(time_scale=1000.0, enable_cache_report=report)
    async with (
        EmulatorServer(config) as engine,
        listening(standalone_sidecar(engine.url)) as served,
        aiohttp.ClientSession() as http,
    ):
        sidecar = served.sidecar
        await eventually(lambda: sidecar.s.engine.known, 10, "the sidecar read the engine's info")
        await _post(http, f"{engine.url}/generate", {"text": OTHER, "sampling_params": {"max_new_tokens": 1}})
        sidecar.s.mirror.admit(as_token_bytes(tokenize(PROMPT)), None)
        url = f"http://127.0.0.1:{served.port}/v1/completions"
        body = {"prompt": PROMPT, "max_tokens": 1}
        if stream:
            await _streamed_usage(http, url, body)
        else:
            await _post(http, url, body)
        status = await (await http.get(f"http://127.0.0.1:{served.port}/prefixfleet/status")).json()
        return status["mirror"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_engine_that_reports_cached_tokens_corrects_the_mirror_on_a_null_usage(stream: bool) -> None:
    mirror = await _mirror_after_a_miss_it_predicted_as_a_hit(report=True, stream=stream)
    assert mirror["compared_requests"] == 1
    assert mirror["engine_cached_tokens"] == 0
    assert mirror["overpredicted_tokens"] == mirror["predicted_cached_tokens"] > 0


async def test_an_engine_that_does_not_report_cached_tokens_leaves_the_mirror_uncorrected() -> None:
    # no prompt_tokens_details means "not reported" here: taken as 0 it would evict tokens the
    # engine may hold
    mirror = await _mirror_after_a_miss_it_predicted_as_a_hit(report=False, stream=False)
    assert mirror["compared_requests"] == 0
    assert mirror["overpredicted_tokens"] == 0
