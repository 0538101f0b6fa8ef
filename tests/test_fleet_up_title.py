"""`prefixfleet up`'s table title counts in English: "1 gateway", not "1 gateways"."""

from __future__ import annotations

from typing import Any

import pytest

from prefixfleet.fleet.cli import format_up


def _report(requests: int, replicas: int, gateways: int) -> dict[str, Any]:
    engine = {"cache_tokens": 4096, "time_scale": 20.0}
    settings = {"requests": requests, "replicas": replicas, "gateways": gateways, "engine": engine}
    return {"workload": "prefixroute", "settings": settings, "policies": {}}


@pytest.mark.parametrize(
    ("counts", "said"),
    [
        ((1, 1, 1), "prefixroute: 1 request, 1 engine × 4096 cache tokens, 1 gateway, time-scale 20.0"),
        ((50, 3, 2), "prefixroute: 50 requests, 3 engines × 4096 cache tokens, 2 gateways, time-scale 20.0"),
    ],
)
def test_the_title_pluralises_each_count(counts: tuple[int, int, int], said: str) -> None:
    assert format_up(_report(*counts)).splitlines()[0] == f"{said} (TTFT wall-clock ms)"
