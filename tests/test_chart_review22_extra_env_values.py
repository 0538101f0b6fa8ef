"""operator.extraEnv takes a variable's value as `--set` and values files type it.

`--set operator.extraEnv[0].name=PREFIXFLEET_DRAIN_SECONDS,operator.extraEnv[0].value=30` (the way to
tune the operator's numeric variables, PREFIXFLEET_RECONCILE_INTERVAL and the like) gives Helm the
integer 30, and a values file's `value: 30` or `value: true` a number or a boolean. The schema lets any
value through and the chart rendered it as it came, `value: 30`, which the API server refuses (an
EnvVar's value is a string): `helm install` failed at apply, naming a Go type, not the value.
Specification: every extraEnv value renders as the string the user wrote (what a shell export of it
would hold); strings, a null value and valueFrom entries are left as they are.
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_fixtures import CHART, render

K8S_VERSION = "1.33.0"


def operator_deployment(values: dict[str, Any]) -> dict[str, Any]:
    with helm_python.Chart.load(CHART) as chart:
        (deployment,) = [
            o
            for o in render(chart, values)
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
        ]
    return deployment


def extra_env(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deployment = operator_deployment(values)
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)  # raises on `value: 30`
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


SET = {
    "an integer": ("30", "30"),
    "a boolean": ("true", "true"),
    "a string": ("http://q:9090", "http://q:9090"),
}


@pytest.mark.parametrize(("given", "wanted"), SET.values(), ids=SET.keys())
def test_a_value_given_with_set_renders_as_the_string_written(given: str, wanted: str) -> None:
    values = helm_python.parse_set_string(
        f"operator.extraEnv[0].name=PREFIXFLEET_DRAIN_SECONDS,operator.extraEnv[0].value={given}"
    )
    assert extra_env(values)["PREFIXFLEET_DRAIN_SECONDS"] == {
        "name": "PREFIXFLEET_DRAIN_SECONDS",
        "value": wanted,
    }


FILE = {
    "an integer": (30, "30"),
    "a large integer": (1000000, "1000000"),
    "a fraction": (0.5, "0.5"),
    "a boolean": (False, "false"),
    "a string of digits": ("007", "007"),
}


@pytest.mark.parametrize(("given", "wanted"), FILE.values(), ids=FILE.keys())
def test_a_value_typed_by_a_values_file_renders_as_its_text(given: Any, wanted: str) -> None:
    values = {"operator": {"extraEnv": [{"name": "X", "value": given}]}}
    assert extra_env(values)["X"] == {"name": "X", "value": wanted}


def test_value_from_and_null_values_are_left_as_they_are() -> None:
    secret = {"secretKeyRef": {"name": "redis-default", "key": "url"}}
    values = {
        "operator": {
            "extraEnv": [
                {"name": "PREFIXFLEET_REDIS_URL", "valueFrom": secret},
                {"name": "EMPTY", "value": None},
                {"name": "N", "value": 3},
            ]
        }
    }
    env = extra_env(values)
    assert env["PREFIXFLEET_REDIS_URL"] == {"name": "PREFIXFLEET_REDIS_URL", "valueFrom": secret}
    assert env["EMPTY"].get("value") is None
    assert env["N"] == {"name": "N", "value": "3"}
    names = list(env)
    assert names[-3:] == ["PREFIXFLEET_REDIS_URL", "EMPTY", "N"]  # in the order given, after the chart's
