"""The chart ships the observability pieces: the shipped alerts in the PrometheusRule, the `fleet`
label the dashboard and alerts group by on every scrape, and the generated dashboard."""

from __future__ import annotations

from typing import Any

import helm_python
import yaml
from chart_fixtures import CHART, render

ALERTS = CHART / "files" / "alerts.yaml"


def rule_groups(chart: helm_python.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    (rule,) = [o for o in render(chart, values) if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def test_prometheus_rule_ships_the_tested_alerts_file_verbatim(chart: helm_python.Chart) -> None:
    shipped = yaml.safe_load(ALERTS.read_text())["groups"]
    assert rule_groups(chart, {"prometheusRule": {"enabled": True}}) == shipped


def test_own_groups_come_first_and_shipped_alerts_can_be_left_out(chart: helm_python.Chart) -> None:
    own = {"name": "mine", "rules": [{"alert": "Mine", "expr": "vector(1)"}]}
    groups = rule_groups(chart, {"prometheusRule": {"enabled": True, "groups": [own]}})
    assert groups[0] == own and len(groups) == 1 + len(yaml.safe_load(ALERTS.read_text())["groups"])
    values = {"prometheusRule": {"enabled": True, "groups": [own], "defaultAlerts": False}}
    assert rule_groups(chart, values) == [own]


def test_every_scrape_labels_series_with_the_fleet(chart: helm_python.Chart) -> None:
    values = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    monitors = [o for o in render(chart, values) if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) == 2
    for monitor in monitors:
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        for endpoint in endpoints:
            assert {
                "sourceLabels": ["__meta_kubernetes_pod_label_prefixfleet_io_fleet"],
                "targetLabel": "fleet",
            } in endpoint["relabelings"]
