"""``chaos soak``'s "achieved" request rate is measured from when requests really went out.

Before, it was ``requests / --duration``: the planned rate again, whatever the client managed. Here
the client can hold one request at a time (``max_in_flight=1``) against a stand-in gateway that
answers in 0.1 s, so it cannot start more than 10 requests a second, whatever the plan asks (20).
The fleet is replaced by that stand-in: the figure under test is the client's, not the fleet's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.chaos import scenarios
from prefixfleet.chaos.traffic import Outcome, TrafficPlan, achieved_rate


def _slow_gateway() -> web.Application:
    async def answer(_request: web.Request) -> web.Response:
        await asyncio.sleep(0.1)
        return web.json_response({"choices": [{"text": "a"}], "usage": {"prompt_tokens": 3}})

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    return app


async def test_soak_reports_the_rate_the_client_achieved_not_the_planned_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve_aiohttp(_slow_gateway()) as url:

        @contextlib.asynccontextmanager
        async def stand_in(_run_dir: Path, _fleet: scenarios.ChaosFleet) -> AsyncIterator[SimpleNamespace]:
            yield SimpleNamespace(gateway_urls=[url], gateways=[], replicas=[])

        monkeypatch.setattr(scenarios, "running_fleet", stand_in)
        plan = TrafficPlan(rate_per_s=20.0, duration_s=1.0, stream_fraction=0.0, max_in_flight=1)
        report = await scenarios.soak(tmp_path, plan)
    assert report["overall"]["ok"] == report["overall"]["requests"] == 20, report["overall"]
    # one at a time, 0.1 s each: at most 10 starts a second (slower on a loaded machine, never faster)
    assert report["achieved_rate_per_s"] <= 10.5, report["achieved_rate_per_s"]


def _sent(*starts: float | None) -> list[Outcome]:
    return [Outcome(index=i, stream=False, sent_at=i * 0.1, started_s=s) for i, s in enumerate(starts)]


def test_the_achieved_rate_is_the_starts_over_their_span() -> None:
    assert achieved_rate(_sent(0.0, 0.1, 0.2, 0.3, 0.4)) == pytest.approx(10.0)
    assert achieved_rate(_sent(0.0, 0.2, 0.4)) == pytest.approx(5.0)  # planned 10/s, started 5/s
    assert achieved_rate(_sent(0.5)) is None  # one request has no rate
    assert achieved_rate(_sent(0.0, None)) is None  # a request that never started: no span to judge
