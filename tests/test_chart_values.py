"""The chart's values.schema.json, as Helm 4 applies it on `helm template` / `helm install`.

Specification:
* a mistyped value (a string for a port, an address family that does not exist, a misspelt key at
  any level, an unknown top-level key) is refused when Helm renders, and the refusal names the key;
* the operator's default Redis and Prometheus URLs are refused by the schema exactly when
  ``prefixfleet operator run`` would refuse them at start (the operator pod would crash-loop on
  ``redis://fd00::12:6379/0``): the schema's host-and-port pattern is the models' one;
* the schema cannot drift from the chart: every value a template reads is declared in the schema and
  has a default in values.yaml, and every object the schema declares fields for refuses unknown keys
  (except the few that are Kubernetes objects passed through).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml
from chart_fixtures import CHART

from prefixfleet.operator.models import PROMETHEUS_URL_PATTERN, URL_AUTHORITY_PATTERN
from prefixfleet.router.addresses import authority_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def render(chart: helm_python.Chart, values: dict[str, Any]) -> dict[str, str]:
    return chart.render(values, name="prefixfleet", namespace="prefixfleet")


MISTYPED = {
    "an address family that does not exist": ({"operator": {"ipFamily": "IPv5"}}, "/operator/ipFamily"),
    "a port written as a word": ({"operator": {"livenessPort": "two"}}, "/operator/livenessPort"),
    "a negative metrics port": ({"operator": {"metricsPort": -1}}, "/operator/metricsPort"),
    "a misspelt operator key": ({"operator": {"logLevl": "info"}}, "logLevl"),
    "an unknown top-level key": ({"replicas": "two"}, "replicas"),
    "a flag written as a word": ({"redis": {"enabled": "yes"}}, "/redis/enabled"),
    "a misspelt key two levels down": ({"redis": {"networkPolicy": {"enable": False}}}, "enable"),
    "pull secrets as a string": ({"imagePullSecrets": "ghcr"}, "/imagePullSecrets"),
    # rendered "valkey/valkey:", an image reference no runtime can pull
    "an empty Redis image tag": ({"redis": {"enabled": True, "image": {"tag": ""}}}, "/redis/image/tag"),
    "a label value that is a number": ({"grafanaDashboards": {"labels": {"grafana_dashboard": 1}}}, "labels"),
    "an unbracketed IPv6 Redis host": (
        {"operator": {"defaultRedisUrl": "redis://fd00::12:6379/0"}},
        "/operator/defaultRedisUrl",
    ),
    "a Redis port of 0": ({"operator": {"defaultRedisUrl": "redis://r:0/0"}}, "/operator/defaultRedisUrl"),
    "an unbracketed IPv6 Prometheus host": (
        {"operator": {"defaultPrometheusUrl": "http://fd00::9:9090"}},
        "/operator/defaultPrometheusUrl",
    ),
}


@pytest.mark.parametrize(("values", "key"), MISTYPED.values(), ids=MISTYPED.keys())
def test_a_mistyped_value_is_refused_at_render_naming_the_key(
    chart: helm_python.Chart, values: dict[str, Any], key: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(chart, values)
    assert key in str(err.value)


def test_the_defaults_and_bracketed_ipv6_urls_render(chart: helm_python.Chart) -> None:
    assert render(chart, {})
    values = {
        "operator": {
            "defaultRedisUrl": "redis://[fd00::12]:6379/0",
            "defaultPrometheusUrl": "http://[fd00::9]:9090",
            "ipFamily": "IPv6",
        }
    }
    deployment = next(
        text for path, text in render(chart, values).items() if path.endswith("deployment.yaml")
    )
    (operator,) = yaml.safe_load(deployment)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["PREFIXFLEET_REDIS_URL"] == "redis://[fd00::12]:6379/0"
    assert env["PREFIXFLEET_PROMETHEUS_URL"] == "http://[fd00::9]:9090"


# ------------------------------------------------------------------ default URLs: schema == operator


def operator_refuses(flag: str, url: str) -> bool:
    """What `prefixfleet operator run` checks (operator/run.py) before it starts."""
    if flag == "redis" and not re.match(r"^(redis|rediss|unix)://", url):
        return True
    if flag == "prometheus" and not re.fullmatch(PROMETHEUS_URL_PATTERN, url):
        return True
    return authority_error(url) is not None


URLS = [
    ("redis", "redis://r:6379/0"), ("redis", "redis://[fd00::12]:6379/0"), ("redis", "redis://fd00::12:6379/0"),
    ("redis", "rediss://:secret@[::1]:6380"), ("redis", "redis://:secret@::1:6380"), ("redis", "redis://r:0"),
    ("redis", "redis://r:65535"), ("redis", "redis://r:65536"), ("redis", "redis://[r]:6379"),
    ("redis", "redis://[::1]6379"), ("redis", "redis://r:6379\n"), ("redis", "unix:///run/valkey.sock"),
    ("redis", "redis://[::ffff:10.0.0.1]:6379"), ("redis", "redis://[::ffff:10.0.0.01]:6379"),
    ("redis", "redis://h:²/0"), ("redis", "localhost:6379"),
    ("prometheus", "http://prometheus:9090"), ("prometheus", "http://[fd00::9]:9090/prom"),
    ("prometheus", "http://fd00::9:9090"), ("prometheus", "https://u:p@[fe80::1%25eth0]"),
    ("prometheus", "http://p:99999"), ("prometheus", "http://[fd00::9]x"),
]  # fmt: skip


@pytest.mark.parametrize(("flag", "url"), URLS, ids=[f"{f}-{u!r}" for f, u in URLS])
def test_the_schema_refuses_a_default_url_exactly_when_the_operator_would(
    chart: helm_python.Chart, flag: str, url: str
) -> None:
    key = "defaultRedisUrl" if flag == "redis" else "defaultPrometheusUrl"
    try:
        chart.validate_schema({"operator": {key: url}})
        refused = False
    except helm_python.HelmValuesError as err:
        assert f"/operator/{key}" in str(err)
        refused = True
    assert refused == operator_refuses(flag, url)


def test_the_schema_checks_host_and_port_with_the_models_pattern() -> None:
    operator = SCHEMA["properties"]["operator"]["properties"]
    for key in ("defaultRedisUrl", "defaultPrometheusUrl"):
        # a URL that is set (the empty default is allowed) matches the CRD's host-and-port pattern
        assert operator[key]["if"] == {"minLength": 1}, key
        assert operator[key]["then"] == {"pattern": URL_AUTHORITY_PATTERN}, (
            f"{key}: copy it from operator/models.py"
        )
    assert {"pattern": PROMETHEUS_URL_PATTERN} in operator["defaultPrometheusUrl"]["anyOf"]


# ------------------------------------------------------------------ no drift between chart and schema


def template_value_paths() -> set[tuple[str, ...]]:
    paths = set()
    for template in (CHART / "templates").iterdir():
        for match in re.finditer(r"\.Values((?:\.[A-Za-z0-9_]+)+)", template.read_text()):
            paths.add(tuple(match.group(1).split(".")[1:]))
    return paths


def test_the_templates_read_values() -> None:
    assert ("operator", "ipFamily") in template_value_paths()  # the scan finds them


@pytest.mark.parametrize("path", sorted(template_value_paths()), ids=".".join)
def test_every_value_a_template_reads_is_in_the_schema_and_values_yaml(path: tuple[str, ...]) -> None:
    node, default = SCHEMA, DEFAULTS
    for depth, key in enumerate(path):
        where = ".".join(path[: depth + 1])
        assert key in node.get("properties", {}), f"{where} is read by a template, not in values.schema.json"
        assert isinstance(default, dict) and key in default, f"{where} has no default in values.yaml"
        node, default = node["properties"][key], default[key]


# Kubernetes objects passed through to the rendered manifests: their fields are Kubernetes' to check.
PASS_THROUGH = {"operator.extraEnv[]", "prometheusRule.groups[]", "prometheusRule.groups[].rules[]"}


def object_nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if "properties" in node:
        yield path, node
        for key, sub in node["properties"].items():
            yield from object_nodes(sub, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        yield from object_nodes(node["items"], f"{path}[]")


def test_every_object_with_declared_fields_refuses_unknown_keys() -> None:
    nodes = dict(object_nodes(SCHEMA, ""))
    assert "" in nodes and "redis.networkPolicy" in nodes
    open_ = {path for path, node in nodes.items() if node.get("additionalProperties") is not False}
    assert open_ == PASS_THROUGH
