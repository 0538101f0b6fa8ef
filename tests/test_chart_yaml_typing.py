"""Names the chart writes stay strings whatever they spell.

Kubernetes decodes manifests with sigs.k8s.io/yaml (go-yaml v2, YAML 1.1): a plain scalar ``on``,
``yes`` or ``off`` is a boolean, ``2024`` an integer, ``1e3`` a float. A namespace, release name,
ServiceAccount, priority class or port name the user picked that spells one of those (all valid
Kubernetes names) must still reach the API server as the string it is: the templates quote them.

Specification: rendered through Helm 4 with such names and read with go-yaml v2's typing, every
field that is a string in a plain render is the same string here, and nothing else changes type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "prefixfleet"


class GoYamlV2Loader(yaml.SafeLoader):
    """PyYAML's YAML 1.1 typing (on/yes/off booleans, 007 octal) plus go-yaml v2's floats, which
    need no dot (``1e3`` is 1000.0 there, a string to PyYAML)."""


GoYamlV2Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def everything_on(names: dict[str, Any]) -> dict[str, Any]:
    """Values turning on every object, with the user-picked names of ``names``."""
    return {
        "redis": {"enabled": True},
        "serviceMonitor": {"enabled": True, "port": names["port"]},
        "podMonitor": {"enabled": True, "ports": [names["port"]]},
        "prometheusRule": {"enabled": True},
        "grafanaDashboards": {"enabled": True, "namespace": names["dashboards"]},
        "operator": {
            "watchNamespaces": names["watched"],
            "priorityClassName": names["priority"],
            "metricsPodMonitor": True,
        },
        "rbac": {"scope": "namespace"},
        "serviceAccount": {"create": True, "name": names["account"]},
        "fullnameOverride": names["fullname"],
    }


PLAIN = {
    "release": "rel",
    "namespace": "ns",
    "port": "http",
    "dashboards": "grafana",
    "watched": ["team-a", "team-b"],
    "priority": "high",
    "account": "ops",
    "fullname": "fleet",
}
# Every one a valid release, namespace, priority class or port name; every one retyped unquoted.
TRICKY = {
    "booleans": {
        "release": "on",
        "namespace": "yes",
        "port": "on",
        "dashboards": "off",
        "watched": ["on", "no"],
        "priority": "true",
        "account": "y",
        "fullname": "off",
    },
    "numbers": {
        "release": "1e3",
        "namespace": "2024",
        "port": "n",
        "dashboards": "1e3",
        "watched": ["007", "2025"],
        "priority": "100",
        "account": "42",
        "fullname": "12345",
    },
}


def render(names: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(everything_on(names), name=names["release"], namespace=names["namespace"])
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.load_all(text, Loader=GoYamlV2Loader)
        if doc
    ]


def leaves(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, f"{path}[{i}]")
    else:
        yield path, node


def test_the_loader_types_scalars_as_kubernetes_does() -> None:
    assert yaml.load("[on, yes, off, 2024, 1e3, 007, 'on']", Loader=GoYamlV2Loader) == [
        True,
        True,
        False,
        2024,
        1000.0,
        7,
        "on",
    ]


@pytest.mark.parametrize("case", TRICKY, ids=TRICKY.keys())
def test_names_that_spell_booleans_or_numbers_stay_strings(case: str) -> None:
    plain, tricky = render(PLAIN), render(TRICKY[case])
    assert len(plain) == len(tricky)
    retyped = []
    for plain_doc, tricky_doc in zip(plain, tricky, strict=True):
        plain_leaves = dict(leaves(plain_doc, plain_doc["kind"]))
        for path, value in leaves(tricky_doc, tricky_doc["kind"]):
            expected = type(plain_leaves.get(path, value))
            if type(value) is not expected:
                retyped.append(f"{path}: {value!r}, not {expected.__name__}")
    assert retyped == []


def test_the_names_reach_the_objects_as_written() -> None:
    names = TRICKY["booleans"]
    objects = render(names)
    namespaced = [o for o in objects if o["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"yes", "off", *names["watched"]}
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    operator = deployments["off-operator"]
    pod = operator["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "on"
    assert pod["spec"]["serviceAccountName"] == "y"
    assert pod["spec"]["priorityClassName"] == "true"
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["name"] == "off"
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["port"] == "on"
