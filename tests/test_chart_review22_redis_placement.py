"""The chart's Redis can be placed like the operator: redis.nodeSelector, tolerations, affinity.

On a cluster whose every node is tainted or whose workloads must land on a labelled pool, the chart
let the operator be placed (operator.nodeSelector/tolerations/affinity) but not its Valkey: it stayed
Pending, and every fleet on the default Redis with it, with no value to fix it (the schema refuses
unknown keys, so `--set redis.tolerations...` was refused). Specification: redis.nodeSelector,
redis.tolerations and redis.affinity reach the Valkey pod as given (valid Kubernetes), default to
none, and are checked as the operator's are (a toleration's value is a string).
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_fixtures import CHART, NAMESPACE, RELEASE, render

PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"pool": "infra"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}
                ]
            }
        }
    },
}


def redis_pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    with helm_python.Chart.load(CHART) as chart:
        (deployment,) = [
            o
            for o in render(chart, values)
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-redis")
        ]
    kubernetes_validate.validate(deployment, "1.33.0", strict=True)
    return deployment["spec"]["template"]["spec"]


def test_placement_values_reach_the_redis_pod() -> None:
    spec = redis_pod_spec({"redis": {"enabled": True, **PLACEMENT}})
    assert {key: spec.get(key) for key in PLACEMENT} == PLACEMENT


def test_by_default_the_redis_pod_is_placed_anywhere() -> None:
    spec = redis_pod_spec({"redis": {"enabled": True}})
    assert not set(PLACEMENT) & set(spec)


def test_the_operators_placement_is_its_own() -> None:
    spec = redis_pod_spec({"redis": {"enabled": True}, "operator": PLACEMENT})
    assert not set(PLACEMENT) & set(spec)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"tolerations": [{"key": "k", "operator": "Equal", "value": True}]}, "/redis/tolerations/0/value"),
        ({"nodeSelector": {"gpu": False}}, "/redis/nodeSelector/gpu"),
    ],
)
def test_bad_placement_values_are_refused_by_name(values: dict[str, Any], named: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as err:
        chart.render({"redis": {"enabled": True, **values}}, name=RELEASE, namespace=NAMESPACE)
    assert named in str(err.value)
