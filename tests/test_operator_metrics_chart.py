"""The chart runs the operator with its metrics port and, when asked, scrapes it.

Specification: the operator container gets ``--metrics-port`` and a ``metrics`` containerPort
(``operator.metricsPort``, 0 = neither); ``operator.metricsPodMonitor`` adds a PodMonitor for that port
that keeps the series' own namespace/fleet labels (honorLabels)."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from chart_fixtures import render


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    ]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_operator_serves_metrics_on_its_port_and_a_pod_monitor_scrapes_it(chart: helm_python.Chart) -> None:
    docs = render(chart, {"operator": {"metricsPodMonitor": True}})
    container = operator_container(docs)
    assert "--metrics-port=8081" in container["args"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    (monitor,) = [
        d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-operator")
    ]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    pod_labels = chart_pod_labels(docs)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def chart_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    ]
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_metrics_off_means_no_port_and_no_monitor(chart: helm_python.Chart) -> None:
    docs = render(chart, {"operator": {"metricsPort": 0, "metricsPodMonitor": True}})
    container = operator_container(docs)
    assert "--metrics-port=0" in container["args"]
    assert all(p["name"] != "metrics" for p in container["ports"])
    assert not [d for d in docs if d["kind"] == "PodMonitor"]
    assert not [d for d in render(chart, {}) if d["kind"] == "PodMonitor"]  # off by default


def test_a_metrics_port_equal_to_the_liveness_port_is_refused_by_name(chart: helm_python.Chart) -> None:
    # kopf's liveness endpoint and the metrics server would both bind it: one of them fails.
    with pytest.raises(helm_python.HelmError, match=r"operator\.metricsPort must differ"):
        render(chart, {"operator": {"livenessPort": 9000, "metricsPort": 9000}})
    container = operator_container(render(chart, {"operator": {"livenessPort": 9000, "metricsPort": 0}}))
    assert [p["containerPort"] for p in container["ports"]] == [9000]
