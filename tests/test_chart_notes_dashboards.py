"""What `helm install` prints about the Grafana dashboards names the labels their ConfigMaps carry.

It said ``labelled grafana_dashboard=1`` whatever ``grafanaDashboards.labels`` held, so a release
with its own label (the one its Grafana sidecar watches) or none was told to match a label its
ConfigMaps do not have.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from chart_fixtures import CHART, render
from test_chart_notes import notes

LABELS = {  # grafanaDashboards.labels -> what NOTES.txt says
    "default": ({}, "labelled grafana_dashboard=1"),  # kube-prometheus-stack's sidecar label
    "own label": (
        {"grafana_dashboard": None, "dashboards": "prefixfleet"},
        "labelled dashboards=prefixfleet",
    ),
    "two labels": ({"team": "ml"}, "labelled grafana_dashboard=1, team=ml"),
    "no label": ({"grafana_dashboard": None}, "not labelled"),
}


@pytest.mark.parametrize(("labels", "said"), LABELS.values(), ids=LABELS.keys())
def test_the_dashboards_are_said_to_carry_the_labels_they_carry(labels: dict[str, Any], said: str) -> None:
    values = {"grafanaDashboards": {"labels": labels, "namespace": "monitoring"}}
    with helm_python.Chart.load(CHART) as chart:
        (config_map,) = [o for o in render(chart, values) if o["kind"] == "ConfigMap"]
    chart_labels = {"helm.sh/chart"} | {k for k in config_map["metadata"]["labels"] if "kubernetes.io/" in k}
    carried = {k: v for k, v in config_map["metadata"]["labels"].items() if k not in chart_labels}
    assert carried == {k: v for k, v in {"grafana_dashboard": "1", **labels}.items() if v is not None}
    (line,) = [x for x in notes(values).splitlines() if x.startswith("Grafana:")]
    assert line == f"Grafana: dashboards are ConfigMaps {said} in monitoring."
