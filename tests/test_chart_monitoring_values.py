"""Monitoring values the chart used to render into objects the Prometheus stack throws away whole.

Specification:
* a ServiceMonitor whose ``scrapeTimeout`` exceeds its ``interval`` (``--set
  serviceMonitor.interval=5s`` with the default 10 s timeout) is rejected by the Prometheus Operator
  ("scrapeTimeout greater than scrapeInterval"), and Prometheus refuses such a scrape config too: no
  gateway is scraped, every gateway panel and alert goes blank. The chart refuses it, naming both keys,
  exactly when Prometheus (``promtool check config``) would;
* the PrometheusRule's groups are the user's ``prometheusRule.groups`` then the shipped ones (one
  group named ``prefixfleet``). Two groups with one name, or a rule that is neither one alert nor one
  recording rule or has no expression, make Prometheus (``promtool check rules``) refuse the whole
  rule file, shipped alerts included. The chart refuses them, naming ``prometheusRule.groups``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from chart_fixtures import CHART, render

SHIPPED_GROUP = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())["groups"][0]["name"]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool is not on PATH: apt-get install -y prometheus (.ci/run does this)")
    return subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------ ServiceMonitor interval/timeout

# (interval, scrapeTimeout): Prometheus accepts a timeout up to the interval, never beyond it.
TIMINGS = [
    ("5s", "10s"),  # a faster scrape with the default timeout: the plausible mistake
    ("10s", "10s"),
    ("1m", "1m30s"),
    ("1m30s", "1m"),
    ("1m", "59s"),
    ("500ms", "1s"),
    ("1s", "500ms"),
    ("1h", "61m"),
    ("2m", "119s"),
]


def prometheus_accepts(tmp_path: Path, interval: str, timeout: str) -> bool:
    config = {
        "scrape_configs": [
            {
                "job_name": "gateways",
                "scrape_interval": interval,
                "scrape_timeout": timeout,
                "static_configs": [{"targets": ["127.0.0.1:8080"]}],
            }
        ]
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    return promtool("check", "config", "prometheus.yml", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(("interval", "timeout"), TIMINGS, ids=[f"{i}-{t}" for i, t in TIMINGS])
def test_the_chart_refuses_a_scrape_timeout_exactly_when_prometheus_does(
    chart: helm_python.Chart, tmp_path: Path, interval: str, timeout: str
) -> None:
    values = {"serviceMonitor": {"enabled": True, "interval": interval, "scrapeTimeout": timeout}}
    if prometheus_accepts(tmp_path, interval, timeout):
        (monitor,) = [o for o in render(chart, values) if o["kind"] == "ServiceMonitor"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert (endpoint["interval"], endpoint["scrapeTimeout"]) == (interval, timeout)
    else:
        with pytest.raises(helm_python.HelmError) as err:
            render(chart, values)
        message = str(err.value)
        assert "serviceMonitor.scrapeTimeout" in message and "serviceMonitor.interval" in message
        assert f"({timeout})" in message and f"({interval})" in message


def test_a_faster_scrape_is_refused_only_while_the_service_monitor_is_on(chart: helm_python.Chart) -> None:
    assert render(chart, {"serviceMonitor": {"enabled": False, "interval": "5s"}})
    with pytest.raises(helm_python.HelmError, match=r"serviceMonitor\.scrapeTimeout"):
        render(chart, {"serviceMonitor": {"enabled": True, "interval": "5s"}})


# ------------------------------------------------------------------ PrometheusRule groups


def rule_spec(chart: helm_python.Chart, values: dict[str, Any]) -> dict[str, Any]:
    (rule,) = [o for o in render(chart, values) if o["kind"] == "PrometheusRule"]
    return rule["spec"]


def prometheus_loads(tmp_path: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    return promtool("check", "rules", "rules.yaml", cwd=tmp_path)


def own_group(name: str, **rule: Any) -> dict[str, Any]:
    return {"name": name, "rules": [rule or {"alert": "Mine", "expr": "vector(1) > 0"}]}


def test_own_groups_next_to_the_shipped_alerts_load_in_prometheus(
    chart: helm_python.Chart, tmp_path: Path
) -> None:
    groups = [own_group("mine"), own_group("recorded", record="job:up:sum", expr="sum(up)")]
    spec = rule_spec(chart, {"prometheusRule": {"enabled": True, "groups": groups}})
    assert [g["name"] for g in spec["groups"]] == ["mine", "recorded", SHIPPED_GROUP]
    result = prometheus_loads(tmp_path, spec)
    assert result.returncode == 0, result.stdout + result.stderr


UNLOADABLE_GROUPS = {
    "named like the shipped group": [own_group(SHIPPED_GROUP)],
    "two of one name": [own_group("mine"), own_group("mine")],
}


@pytest.mark.parametrize("groups", UNLOADABLE_GROUPS.values(), ids=UNLOADABLE_GROUPS.keys())
def test_a_group_name_used_twice_is_refused_naming_it(
    chart: helm_python.Chart, tmp_path: Path, groups: list[dict[str, Any]]
) -> None:
    # what the chart rendered before: one rule file Prometheus refuses, the shipped alerts with it
    shipped = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())["groups"]
    refused = prometheus_loads(tmp_path, {"groups": groups + shipped})
    assert refused.returncode != 0 and "is repeated in the same file" in refused.stderr
    with pytest.raises(helm_python.HelmError) as err:
        render(chart, {"prometheusRule": {"enabled": True, "groups": groups}})
    message = str(err.value)
    assert "prometheusRule.groups" in message and f'"{groups[-1]["name"]}"' in message


def test_the_shipped_group_name_is_free_without_the_shipped_alerts(chart: helm_python.Chart) -> None:
    own = [own_group(SHIPPED_GROUP)]
    values = {"prometheusRule": {"enabled": True, "defaultAlerts": False, "groups": own}}
    assert [g["name"] for g in rule_spec(chart, values)["groups"]] == [SHIPPED_GROUP]


UNLOADABLE_RULES = {
    "neither alert nor record": {"expr": "vector(1)"},
    "both alert and record": {"alert": "A", "record": "a:b", "expr": "vector(1)"},
    "no expression": {"alert": "A"},
    "an empty expression": {"alert": "A", "expr": ""},
}


@pytest.mark.parametrize("rule", UNLOADABLE_RULES.values(), ids=UNLOADABLE_RULES.keys())
def test_a_rule_prometheus_cannot_load_is_refused_naming_the_groups(
    chart: helm_python.Chart, tmp_path: Path, rule: dict[str, Any]
) -> None:
    assert prometheus_loads(tmp_path, {"groups": [own_group("mine", **rule)]}).returncode != 0
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(chart, {"prometheusRule": {"enabled": True, "groups": [own_group("mine", **rule)]}})
    assert "/prometheusRule/groups" in str(err.value)
