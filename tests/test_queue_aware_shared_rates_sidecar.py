"""A real sidecar publishes its worker's arrival and cache-write rates in its load record.

Real processes: Valkey on 127.0.0.1, the real sidecar (``listening``) in front of a stand-in engine.
Requests go through the sidecar (as any gateway's would); the load record in Redis then carries the
decayed rate of those arrivals and of the uncached tokens they wrote (a repeated prompt writes
none). Bounds come from the record's own ``ts`` and the wall clock around each request, so a slow
machine widens nothing: each send decays by at most its age at ``ts`` and at least 0.
"""

from __future__ import annotations

import math
import time

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, RedisServer, eventually, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.policies.base import RATE_WINDOW_S
from prefixfleet.router.records import LoadReport, decode_load
from prefixfleet.router.sidecar import listening

pytestmark = pytest.mark.timeout(60)
FLEET = "sharedrates"
PROMPT_TOKENS = 64


def _bounds(sends: list[tuple[float, float, float]], ts: float) -> tuple[float, float]:
    """(lowest, highest) decayed rate at ``ts`` of sends stamped somewhere in (before, after), each
    weighing ``amount``."""
    low = sum(a * math.exp(-max(ts - before, 0.0) / RATE_WINDOW_S) for before, _, a in sends)
    high = sum(a * math.exp(-max(ts - after, 0.0) / RATE_WINDOW_S) for _, after, a in sends)
    return low / RATE_WINDOW_S, high / RATE_WINDOW_S


async def test_the_published_rates_follow_the_requests_sent_through_the_sidecar(
    redis_server: RedisServer,
) -> None:
    async def generate(_request: web.Request) -> web.Response:
        return web.json_response({"text": "", "meta_info": {}})

    app = stand_in_engine({"/generate": generate})
    client = redis_server.client()
    key = FleetKeys(FLEET).load("w0")

    def record() -> LoadReport | None:
        raw = client.get(key)
        return None if raw is None else decode_load(raw)

    config = dict(redis_url=redis_server.url, fleet=FLEET, publish_interval_s=0.05)
    async with (
        serve_aiohttp(app) as engine,
        listening(standalone_sidecar(engine, **config)) as served,
        aiohttp.ClientSession() as http,
    ):
        first = await eventually(record, 30, "the first load record")
        assert (first.arrivals_per_s, first.write_tokens_per_s) == (0.0, 0.0)  # nothing sent yet
        arrivals: list[tuple[float, float, float]] = []
        writes: list[tuple[float, float, float]] = []
        # three prompts, each sent twice: the first time all its tokens are new, the second none
        for repeat in range(2):
            for p in range(3):
                ids = [1000 * (p + 1) + i for i in range(PROMPT_TOKENS)]
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
                before = time.time()
                async with http.post(f"http://{LOOPBACK}:{served.port}/generate", json=body) as resp:
                    assert resp.status == 200
                after = time.time()
                arrivals.append((before, after, 1.0))
                writes.append((before, after, float(PROMPT_TOKENS if repeat == 0 else 0)))
        sent_by = arrivals[-1][1]

        def after_the_last() -> LoadReport | None:
            load = record()
            return load if load is not None and load.ts > sent_by else None

        load = await eventually(after_the_last, 30, "a load record written after the last request")
        assert load.arrivals_per_s is not None and load.write_tokens_per_s is not None
        low, high = _bounds(arrivals, load.ts)
        # the record rounds to 4 decimals (arrivals) and 1 (tokens)
        assert low - 1e-4 <= load.arrivals_per_s <= high + 1e-4
        low, high = _bounds(writes, load.ts)
        assert low - 0.1 <= load.write_tokens_per_s <= high + 0.1
        # the repeats wrote nothing: 3 prompts' tokens, not 6
        assert load.write_tokens_per_s <= 3 * PROMPT_TOKENS / RATE_WINDOW_S + 0.1
