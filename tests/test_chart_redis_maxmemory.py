"""redis.maxMemory takes what valkey's maxmemory takes (its units in any case), never 0.

The schema allowed only lower-case ``b``/``kb``/``mb``/``gb``: ``1GB``, ``512m`` or ``2g``, which
valkey reads (units are case-insensitive; ``k``/``m``/``g`` are powers of 1000), were refused by
``helm install``. Specification: a value renders exactly when the chart's valkey accepts it as
maxmemory and it is not 0 (valkey's "no limit", which the schema refuses on purpose).
"""

from __future__ import annotations

import helm_python
import pytest
import redis
from chart_fixtures import CHART, render
from fleet_fixtures import RedisServer

VALUES = ["256mb", "1GB", "1Gb", "512m", "512M", "2g", "100k", "64KB", "300000000", "4096b", "4096B"]
VALUES += ["0", "0mb", "1tb", "1.5gb", "256 mb", "mb", "-1mb", "256mib"]


# The container's memory limit above every value tried: a maxMemory at or above it is refused on its
# own account (tests/test_chart_review22_redis_memory_limit.py), not for its units.
ROOMY = {"limits": {"memory": "64Gi"}}


def renders(chart: helm_python.Chart, value: str) -> bool:
    try:
        chart.render(
            {"redis": {"enabled": True, "maxMemory": value, "resources": ROOMY}}, name="pf", namespace="pf"
        )
    except helm_python.HelmValuesError as err:
        assert "/redis/maxMemory" in str(err)
        return False
    return True


def valkey_takes(client: redis.Redis, value: str) -> bool:
    try:
        client.config_set("maxmemory", value)
    except redis.ResponseError:
        return False
    return int(client.config_get("maxmemory")["maxmemory"]) > 0


def test_the_chart_takes_what_valkey_takes(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    with helm_python.Chart.load(CHART) as chart:
        verdicts = {value: (renders(chart, value), valkey_takes(client, value)) for value in VALUES}
    assert {v: chart for v, (chart, valkey) in verdicts.items() if chart != valkey} == {}
    assert verdicts["1GB"] == (True, True) and verdicts["0"] == (False, False)


@pytest.mark.parametrize("value", ["1GB", "512m"])
def test_the_value_reaches_valkey_as_given(value: str) -> None:
    with helm_python.Chart.load(CHART) as chart:
        objects = render(chart, {"redis": {"enabled": True, "maxMemory": value, "resources": ROOMY}})
    (valkey,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-redis")]
    args = valkey["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--maxmemory") + 1] == value
