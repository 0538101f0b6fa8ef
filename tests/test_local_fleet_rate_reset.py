"""The local fleet's reset between `prefixfleet up` policies also forgets the sidecars' traffic rates.

Each sidecar publishes its worker's decayed arrival and cache-write rates in its load record, and
queue_aware (the default policy) reads them. The reset flushes the caches but the sidecars live on:
before, each policy started with the previous policy's rates (`up --policies round_robin,queue_aware`:
queue_aware's first decisions read ~3.6 arrivals/s on every replica it had sent nothing to).
Real processes: Valkey, one emulated engine, its sidecar.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import eventually

from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet, rates_are_quiet
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, decode_load

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[LocalFleet]:
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=1, engine=EngineSettings(cache_tokens=20_000)))
        await fleet.start_engines()
        yield fleet


async def stored_load(fleet: LocalFleet) -> LoadReport | None:
    """The replica's load record as a gateway reads it from Redis."""
    client = aioredis.Redis.from_url(fleet.redis_url)
    try:
        raw = await client.get(FleetKeys(fleet.spec.fleet_name).load(fleet.replicas[0].worker_id))
    finally:
        await client.aclose()
    return None if raw is None else decode_load(raw)


async def test_after_a_reset_the_sidecars_publish_no_traffic_rates(fleet: LocalFleet) -> None:
    sidecar = fleet.replicas[0].sidecar_url
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(5):
            body = {"text": f"question {i} for the rate reset test", "sampling_params": {"max_new_tokens": 1}}
            assert (await http.post(f"{sidecar}/generate", json=body)).status_code == 200

        async def busy() -> bool:
            report = await stored_load(fleet)
            return report is not None and bool(report.arrivals_per_s)

        await eventually(busy, 30, "the load record to carry the requests' rates")

        await fleet.reset()

        # what the next policy's gateways read at once: no rates left from the run before
        report = await stored_load(fleet)
        assert report is not None
        assert report.arrivals_per_s == 0.0 and report.write_tokens_per_s == 0.0, report
        status = (await http.get(f"{sidecar}/prefixfleet/status")).json()["load"]
        assert status["arrivals_per_s"] == 0.0 and status["write_tokens_per_s"] == 0.0, status
        # the reset is a control route: refused without the fleet's token
        refused = await http.post(f"{sidecar}/prefixfleet/reset_rates")
        assert refused.status_code == 401, refused.text


def test_quiet_rates_are_below_a_small_threshold_and_missing_ones_are_quiet() -> None:
    base = LoadReport(
        seq=1, ts=0.0, state="ready", engine_ok=True, in_flight=0, queued=0, pending_prefill_tokens=0,
        prefill_tokens_per_s=1000.0, cached_tokens=0, capacity_tokens=1, summary_version=0,
    )  # fmt: skip
    assert rates_are_quiet(base)  # a sidecar that publishes no rates has none to forget
    assert rates_are_quiet(replace(base, arrivals_per_s=0.0, write_tokens_per_s=0.0))
    assert not rates_are_quiet(replace(base, arrivals_per_s=0.3, write_tokens_per_s=0.0))
    assert not rates_are_quiet(replace(base, arrivals_per_s=0.0, write_tokens_per_s=50.0))
