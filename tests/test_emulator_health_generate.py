"""/health_generate as SGLang answers it: healthy once the scheduler produces anything, busy or not,
and its probe request left out of the request metrics (SGLang's ``log_metrics=False``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from fleet_fixtures import eventually

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer

COUNTERS = (
    "sglang:num_requests_total",
    "sglang:prompt_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_aborted_requests_total",
    "sglang:time_to_first_token_seconds_count",
    "sglang:e2e_request_latency_seconds_count",
)


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # longer than the emulator's 20 s probe timeout: a 503 after it is a failure, not a client timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def counters(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {name: metric_value(text, name) for name in COUNTERS}


async def test_a_busy_engine_is_healthy_as_soon_as_it_makes_progress(http):
    # One running slot, held for ~300 s (16000 decode steps of 20 ms): the probe's own request can
    # never run, yet SGLang answers 200 as soon as the scheduler sends any output (it was a 503 after
    # 20 s here: the probe waited in the queue behind the running request).
    cfg = EmulatorConfig(cache_tokens=50_000, max_running=1, max_new_tokens_limit=16_000)
    async with EmulatorServer(cfg) as s:
        body = {"text": "keep the slot busy", "sampling_params": {"max_new_tokens": 16_000}, "stream": True}
        async with http.post(s.url + "/generate", json=body) as stream:
            await stream.content.readuntil(b"\n\n")  # first token: it runs
            async with http.get(s.url + "/health_generate") as r:
                assert r.status == 200
            # the probe does not stay queued behind the running request once answered
            load = await eventually(
                lambda: _load(http, s.url), 10, "the probe to leave the queue", done=lambda x: x[1] == 0
            )
            assert load == (1, 0)


async def _load(http: aiohttp.ClientSession, url: str) -> tuple[int, int]:
    async with http.get(url + "/get_load") as r:
        load = (await r.json())[0]
    return load["num_running_reqs"], load["num_waiting_reqs"]


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_health_probes_move_no_request_metric(http, busy: bool):
    cfg = EmulatorConfig(time_scale=50.0, cache_tokens=50_000, max_running=1, max_new_tokens_limit=16_000)
    async with EmulatorServer(cfg) as s:
        stream = None
        if busy:
            body = {"text": "busy", "sampling_params": {"max_new_tokens": 16_000}, "stream": True}
            stream = await http.post(s.url + "/generate", json=body)
            await stream.content.readuntil(b"\n\n")
        before = await counters(http, s.url)
        for _ in range(3):
            async with http.get(s.url + "/health_generate") as r:
                assert r.status == 200
        now = await counters(http, s.url)
        if busy:  # the running request keeps generating
            del now["sglang:generation_tokens_total"], before["sglang:generation_tokens_total"]
        assert now == before
        if stream is not None:
            stream.close()
        # an ordinary request still counts
        ordinary = {"text": "count me", "sampling_params": {"max_new_tokens": 2}}
        async with http.post(s.url + "/generate", json=ordinary) as r:
            assert r.status == 200
        after = await eventually(
            lambda: counters(http, s.url), 10, "the request to be counted",
            done=lambda c: c["sglang:num_requests_total"] == before["sglang:num_requests_total"] + 1,
        )  # fmt: skip
        assert after["sglang:prompt_tokens_total"] == before["sglang:prompt_tokens_total"] + 2
