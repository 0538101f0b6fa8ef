"""operator.extraEnv may set a variable the chart sets itself: the user's value replaces the chart's.

The template listed the chart's variables (PREFIXFLEET_IMAGE, PREFIXFLEET_REDIS_URL, POD_NAMESPACE,
...) and then operator.extraEnv, so e.g. PREFIXFLEET_REDIS_URL from a Secret (a default Redis URL
holding a password, kept out of the Deployment) or PREFIXFLEET_IMAGE (the fleets' image from a
mirror) rendered one name twice. Helm 4 installs by server-side apply, which refuses a keyed list with
a repeated key: "failed to create typed patch object ... env: duplicate entries for key
[name=...]" (helm/helm#31529), so such a release did not install. Specification: every name once;
an extraEnv entry replaces the chart's of that name; extraEnv repeating a name is refused by name.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from chart_fixtures import CHART, render

SECRET_URL = {"secretKeyRef": {"name": "redis-default", "key": "url"}}


def operator_env(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        (deployment,) = [
            o
            for o in render(chart, values)
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
        ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["env"]


OVERRIDES = {
    "a Redis URL from a Secret": (
        {"redis": {"enabled": True}},
        {"name": "PREFIXFLEET_REDIS_URL", "valueFrom": SECRET_URL},
    ),
    "the fleets' image from a mirror": (
        {},
        {"name": "PREFIXFLEET_IMAGE", "value": "mirror/prefixfleet:0.1.0"},
    ),
    "a Prometheus URL": (
        {"operator": {"defaultPrometheusUrl": "http://p:9090"}},
        {"name": "PREFIXFLEET_PROMETHEUS_URL", "value": "http://q:9090"},
    ),
}


@pytest.mark.parametrize(("values", "entry"), OVERRIDES.values(), ids=OVERRIDES.keys())
def test_an_extra_env_entry_replaces_the_charts_own(values: dict[str, Any], entry: dict[str, Any]) -> None:
    operator = {**values.get("operator", {}), "extraEnv": [entry, {"name": "EXTRA", "value": "x"}]}
    env = operator_env({**values, "operator": operator})
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), f"repeated: {names}"
    assert [e for e in env if e["name"] == entry["name"]] == [entry]
    assert names[-2:] == [entry["name"], "EXTRA"]  # after the chart's, which they may reference
    assert {"PYTHONUNBUFFERED", "POD_NAMESPACE", "PREFIXFLEET_IMAGE"} <= set(names)


def test_without_extra_env_the_charts_variables_are_as_before() -> None:
    env = operator_env({"redis": {"enabled": True}, "operator": {"defaultPrometheusUrl": "http://p:9090"}})
    assert env == [
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "PREFIXFLEET_IMAGE", "value": "ghcr.io/prefixfleet/prefixfleet:0.1.0"},
        {"name": "PREFIXFLEET_REDIS_URL", "value": "redis://prefixfleet-redis.prefixfleet.svc:6379/0"},
        {"name": "PREFIXFLEET_PROMETHEUS_URL", "value": "http://p:9090"},
    ]


def test_extra_env_naming_one_variable_twice_is_refused_by_name() -> None:
    twice = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    with pytest.raises(helm_python.HelmError) as err:
        operator_env({"operator": {"extraEnv": twice}})
    assert "operator.extraEnv" in str(err.value) and '"A"' in str(err.value)
