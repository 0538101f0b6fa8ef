"""Resource quantities in a values file are taken the way Kubernetes takes them: a string, an
integer, or a decimal number (``cpu: 0.5``).

values.schema.json typed a quantity ``string`` or ``integer``: ``cpu: 0.5`` written in a values file
(YAML reads it as a number, which Kubernetes' Quantity accepts) was refused by ``helm install``
("got number, want integer or string"). Specification: the operator's and the chart Redis's
resources take decimal numbers and render them as given; a negative number is still refused.
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_fixtures import CHART, render

RESOURCES = {"requests": {"cpu": 0.5, "memory": "128Mi"}, "limits": {"cpu": 1.5, "memory": "1Gi"}}


def container_resources(values: dict[str, Any], deployment: str) -> dict[str, Any]:
    with helm_python.Chart.load(CHART) as chart:
        objects = render(chart, values)
    (found,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(deployment)
    ]
    kubernetes_validate.validate(found, "1.33.0", strict=True)
    return found["spec"]["template"]["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize(
    ("values", "deployment"),
    [
        ({"operator": {"resources": RESOURCES}}, "-operator"),
        ({"redis": {"enabled": True, "resources": RESOURCES}}, "-redis"),
    ],
    ids=["operator", "redis"],
)
def test_decimal_cpu_quantities_render_as_given(values: dict[str, Any], deployment: str) -> None:
    assert container_resources(values, deployment) == RESOURCES


def test_a_negative_quantity_is_still_refused_by_name() -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema({"operator": {"resources": {"requests": {"cpu": -0.5}}}})
    assert "/operator/resources/requests/cpu" in str(err.value)
