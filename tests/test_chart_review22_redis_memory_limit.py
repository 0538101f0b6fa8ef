"""redis.maxMemory must stay below the Valkey container's memory limit.

valkey's maxmemory bounds its data, not the process: with `--set redis.maxMemory=1gb` and the chart's
default limit (384Mi) the container is OOM-killed once the store fills, instead of evicting (the
chart's volatile-lru), and every restart empties membership and summaries; nothing said so at
`helm install`. Specification: with redis.enabled and a memory limit both readable, a maxMemory at or
above the limit is refused naming both values (units: valkey's k/kb/m/mb/g/gb, case-insensitive;
Kubernetes' Ki..Ei, k..E, decimals, plain bytes); below it, or with no limit, it renders as given.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from chart_fixtures import CHART, NAMESPACE, RELEASE, render


def redis_values(max_memory: str, limit: Any = "default") -> dict[str, Any]:
    redis: dict[str, Any] = {"enabled": True, "maxMemory": max_memory}
    if limit is None:
        redis["resources"] = {"requests": {"memory": "64Mi"}, "limits": None}
    elif limit != "default":
        redis["resources"] = {"limits": {"memory": limit}}
    return {"redis": redis}


def refusal(values: dict[str, Any]) -> str | None:
    with helm_python.Chart.load(CHART) as chart:
        try:
            render(chart, values)
        except helm_python.HelmError as err:
            return str(err)
    return None


OVER = {
    "1gb over the default 384Mi": ("1gb", "default"),
    "384mb (MiB) equal to 384Mi": ("384mb", "default"),
    "1GB over 512Mi": ("1GB", "512Mi"),
    "2g (decimal) over 1Gi": ("2g", "1Gi"),
    "600000000 bytes over 0.5Gi": ("600000000", "0.5Gi"),
    "1gb over 1G (decimal)": ("1gb", "1G"),
    "100mb over a limit in plain bytes": ("100mb", 100000000),
}


@pytest.mark.parametrize(("max_memory", "limit"), OVER.values(), ids=OVER.keys())
def test_a_max_memory_at_or_above_the_limit_is_refused_naming_both(max_memory: str, limit: Any) -> None:
    said = refusal(redis_values(max_memory, limit))
    assert said is not None, f"maxmemory {max_memory} with a {limit} limit rendered"
    assert f"redis.maxMemory ({max_memory})" in said
    assert "redis.resources.limits.memory" in said and str(limit if limit != "default" else "384Mi") in said


UNDER = {
    "the defaults": ("256mb", "default"),
    "1gb under 2Gi": ("1gb", "2Gi"),
    "1GB (GiB) under 1.5Gi": ("1GB", "1.5Gi"),
    "512m (decimal) under 512Mi": ("512m", "512Mi"),
    "300000000 bytes under 384Mi": ("300000000", "384Mi"),
    "no limit at all": ("8gb", None),
    "a limit the chart cannot read": ("1gb", "1e10"),
}


@pytest.mark.parametrize(("max_memory", "limit"), UNDER.values(), ids=UNDER.keys())
def test_a_max_memory_below_the_limit_or_without_one_renders(max_memory: str, limit: Any) -> None:
    values = redis_values(max_memory, limit)
    assert refusal(values) is None
    with helm_python.Chart.load(CHART) as chart:
        objects = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert f"- {max_memory!r}".replace("'", '"') in objects[f"{CHART.name}/templates/redis.yaml"]


def test_without_the_charts_redis_nothing_is_checked() -> None:
    assert refusal({"redis": {"enabled": False, "maxMemory": "8gb"}}) is None
