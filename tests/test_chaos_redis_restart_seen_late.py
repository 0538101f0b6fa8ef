"""The redis-outage scenario's recovery figures do not depend on how soon the restart is *seen*.

On a loaded machine the new Redis can answer (and every sidecar republish its summary) a while before
the scenario's readiness poll notices it. A summary written in that gap is as fresh as any: the
gateways' recovery must still be found, not reported as never happening (None) because no request
arrived afterwards to make a newer summary.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prefixfleet.chaos import scenarios
from prefixfleet.chaos.scenarios import ChaosFleet, redis_outage
from prefixfleet.chaos.traffic import TrafficPlan

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SEEN_LATE_S = 4.0  # longer than the traffic left after the restart: no summary is written after it


async def test_gateway_recovery_is_found_when_the_restart_is_seen_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restart = scenarios.restart_redis

    async def restart_seen_late(sup, endpoint):  # type: ignore[no-untyped-def]
        started = await restart(sup, endpoint)
        await asyncio.sleep(SEEN_LATE_S)
        return started

    monkeypatch.setattr(scenarios, "restart_redis", restart_seen_late)
    # Redis is down from 1.0 s to 3.0 s; the traffic ends at 4.0 s, well before the restart is seen (7 s)
    plan = TrafficPlan(rate_per_s=20, duration_s=4, stream_fraction=0.0)
    report = await redis_outage(
        tmp_path, plan, ChaosFleet(replicas=2, gateways=1), outage_s=2.0, stop_at_s=1.0, recovery_wait_s=8.0
    )
    assert report["after_restart"]["requests"] == 0, "the traffic was to end before the restart was seen"
    recovery = report["recovery_s"]
    assert all(recovery[k] is not None for k in ("membership", "summaries", "gateway_views")), recovery
    for phase in ("before_outage", "during_outage"):
        assert report[phase]["ok"] == report[phase]["requests"], (phase, report[phase])
