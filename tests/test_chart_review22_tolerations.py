"""operator.tolerations: a toleration the API server would refuse is refused at `helm install`, by name.

Tolerations are usually given with `--set` (`operator.tolerations[0].key=dedicated,...value=true`),
which types `true` as a boolean and `300` as a number; the schema took any object, so such a value
(or a misspelt field, `efect`) rendered a Deployment the API server refuses at apply with a Go
unmarshalling error, after Helm had said nothing. nodeSelector, podLabels and podAnnotations were
already refused by the schema naming the key. Specification: a toleration's key, operator, value and
effect are strings, tolerationSeconds an integer, no other field; a refusal names the value's path;
valid tolerations render as given and pass Kubernetes' schema.
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_fixtures import CHART, NAMESPACE, RELEASE, render

PREFIX = "operator.tolerations[0]"


def set_values(*pairs: str) -> dict[str, Any]:
    return helm_python.parse_set_string(",".join(f"{PREFIX}.{p}" for p in pairs))


REFUSED = {
    "a boolean value from --set": (
        set_values("key=dedicated", "operator=Equal", "value=true", "effect=NoSchedule"),
        "/operator/tolerations/0/value",
    ),
    "a numeric value from --set": (
        set_values("key=pool", "operator=Equal", "value=1", "effect=NoSchedule"),
        "/operator/tolerations/0/value",
    ),
    "a misspelt field": (
        {"operator": {"tolerations": [{"key": "gpu", "operator": "Exists", "efect": "NoSchedule"}]}},
        "efect",
    ),
    "tolerationSeconds as text": (
        {"operator": {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": "300"}]}},
        "/operator/tolerations/0/tolerationSeconds",
    ),
}


@pytest.mark.parametrize(("values", "named"), REFUSED.values(), ids=REFUSED.keys())
def test_a_toleration_kubernetes_would_refuse_is_refused_by_name(values: dict[str, Any], named: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert named in str(err.value)


ACCEPTED = [
    [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    [{"operator": "Exists"}],  # tolerates every taint
    [
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        }
    ],
    [{"key": "spot", "value": "true", "effect": ""}],  # operator defaults to Equal, empty effect: all
]


@pytest.mark.parametrize("tolerations", ACCEPTED, ids=range(len(ACCEPTED)))
def test_valid_tolerations_render_as_given(tolerations: list[dict[str, Any]]) -> None:
    with helm_python.Chart.load(CHART) as chart:
        (deployment,) = [
            o
            for o in render(chart, {"operator": {"tolerations": tolerations}})
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
        ]
    assert deployment["spec"]["template"]["spec"]["tolerations"] == tolerations
    kubernetes_validate.validate(deployment, "1.33.0", strict=True)


def test_set_string_is_the_way_to_give_a_value_that_looks_like_a_boolean() -> None:
    values = helm_python.parse_set_string(f"{PREFIX}.key=dedicated,{PREFIX}.operator=Equal")
    values["operator"]["tolerations"][0]["value"] = "true"  # what --set-string gives
    with helm_python.Chart.load(CHART) as chart:
        objects = render(chart, values)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["tolerations"][0]["value"] == "true"
