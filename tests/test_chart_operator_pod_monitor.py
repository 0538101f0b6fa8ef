"""The operator's own PodMonitor (``operator.metricsPodMonitor``) takes the labels and interval the
docs' chart table says: ``podMonitor.labels`` (what a Prometheus' podMonitorSelector matches) and
``podMonitor.interval``, whether or not the replicas' PodMonitor (``podMonitor.enabled``) is on.

The table said neither, so a user of kube-prometheus-stack (which selects monitors by its
``release`` label) could not tell how to make Prometheus pick the operator's monitor up.
"""

from __future__ import annotations

from pathlib import Path

import helm_python
from chart_fixtures import render

from tests.test_chart import by_kind

DOC = Path(__file__).resolve().parents[1] / "docs" / "operator.md"


def test_the_operator_pod_monitor_takes_the_pod_monitor_labels_and_interval(chart: helm_python.Chart) -> None:
    values = {
        "operator": {"metricsPodMonitor": True},
        "podMonitor": {"labels": {"release": "kps"}, "interval": "45s"},
    }
    (monitor,) = by_kind(render(chart, values), "PodMonitor")
    assert monitor["metadata"]["name"].endswith("-operator")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert [e["interval"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["45s"]
    (row,) = [
        line for line in DOC.read_text().splitlines() if line.startswith("| `operator.metricsPodMonitor`")
    ]
    assert "`podMonitor.labels`" in row and "`podMonitor.interval`" in row
