"""What `helm install` prints (templates/NOTES.txt) can be followed as written.

It told a release watching only some namespaces to `kubectl apply` the example into the current
one (which the operator then ignores), fetched the example from a raw GitHub URL of the chart's
placeholder home instead of the repository's examples/, and left the gateway Service's name as
`<the gateway Service from that URL>` although the operator names it `<fleet>-router`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from prefixfleet.operator import planner

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "prefixfleet"
EXAMPLE = ROOT / "examples" / "emulator-fleet.yaml"


def notes(values: dict[str, Any]) -> str:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="prefixfleet", namespace="prefixfleet")
    (text,) = [t for path, t in rendered.items() if path.endswith("NOTES.txt")]
    return text


def test_the_example_and_its_gateway_service_are_named_as_they_are() -> None:
    text = notes({})
    fleet = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    service = planner.router_name(planner.FleetRef(name=fleet, namespace="default", uid="u"))
    assert "kubectl apply -f examples/emulator-fleet.yaml" in text
    assert "raw.githubusercontent.com" not in text
    assert f"kubectl port-forward svc/{service} 8080:8080" in text
    assert "-n NAMESPACE" not in text  # every namespace is watched: the current one will do
    bounds = yaml.safe_load(EXAMPLE.read_text())["spec"]["autoscaling"]
    assert f"spec.autoscaling: {bounds['minReplicas']} to {bounds['maxReplicas']} replicas" in text


def test_a_release_watching_some_namespaces_says_where_to_create_the_fleet() -> None:
    text = notes({"operator": {"watchNamespaces": ["team-a", "team-b"]}})
    assert "watches PrefixCacheFleets in team-a, team-b." in text
    assert "add -n NAMESPACE (one the operator watches) to the kubectl commands below" in text


SECRETS_WARNING = "with rbac.scope=cluster the operator may get any Secret, in every namespace, by name"


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_default_cluster_wide_secret_read_is_said_with_the_narrower_choices() -> None:
    text = one_line(notes({}))
    assert SECRETS_WARNING in text
    assert "Narrower: rbac.scope=namespace (only in operator.watchNamespaces)" in text
    assert "rbac.readSecrets=false (none; fleets then give spec.redis.url)" in text


NARROWER = {
    "namespace-scope": {"rbac": {"scope": "namespace"}, "operator": {"watchNamespaces": ["team-a"]}},
    "no-secret-reads": {"rbac": {"readSecrets": False}},
    "no-rbac": {"rbac": {"create": False}},
}


@pytest.mark.parametrize("values", NARROWER.values(), ids=NARROWER.keys())
def test_a_narrower_release_is_not_warned_of_cluster_wide_secret_reads(values: dict[str, Any]) -> None:
    assert "any Secret" not in one_line(notes(values))
