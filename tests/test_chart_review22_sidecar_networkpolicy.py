"""The NetworkPolicy docs/operator.md gives for a fleet's replicas admits exactly who must reach them.

The docs advised restricting the sidecar port with "a NetworkPolicy admitting only the gateways". The
sidecar port is also reached by the operator (it waits for a new replica's sidecar and sends it
POST /prefixfleet/warm; without Prometheus the autoscaler reads each sidecar's /metrics), by the
fleet's other sidecars (a warming sidecar fetches GET /prefixfleet/prefix/{hash} from a holder's) and
by Prometheus: such a policy leaves new replicas cold and the autoscaler blind, with no error at
`kubectl apply`. Specification: the documented policy is valid Kubernetes and, evaluated with
NetworkPolicy's rules against the pods the operator's planner builds and the operator pod the chart
renders, admits those four to the sidecar port and nobody else (another pod of the namespace, another
fleet, a look-alike in another namespace, another release's operator), and selects the replicas only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from chart_fixtures import CHART

from prefixfleet.operator import planner
from prefixfleet.operator.models import PrefixCacheFleet

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "operator.md"
FLEET, FLEET_NS, RELEASE_NS, MONITORING_NS = "chat", "team-a", "prefixfleet", "monitoring"
REDIS = "redis://prefixfleet-redis.prefixfleet.svc:6379/0"


def documented_policy() -> dict[str, Any]:
    text = DOC.read_text()
    start = text.find("**NetworkPolicy.**")
    assert start >= 0, "docs/operator.md has no NetworkPolicy paragraph"
    (block,) = re.findall(r"```yaml\n(.*?)```", text[start:], flags=re.S)[:1]
    policy = yaml.safe_load(block)
    assert policy["kind"] == "NetworkPolicy"
    return policy


# ------------------------------------------------------------------ NetworkPolicy's rules


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"evaluator knows matchLabels only: {selector}"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def peer_admits(peer: dict[str, Any], policy_ns: str, src: Pod) -> bool:
    if "namespaceSelector" in peer:
        ns_ok = selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": src.namespace})
    else:
        ns_ok = src.namespace == policy_ns  # a bare podSelector: the policy's own namespace
    return ns_ok and selects(peer.get("podSelector", {}), src.labels)


def port_admits(rule_port: dict[str, Any], dest: Pod, port: int) -> bool:
    wanted = rule_port["port"]
    if isinstance(wanted, str):  # a named port: the destination container's port of that name
        return dest.named_ports.get(wanted) == port and rule_port.get("protocol", "TCP") == "TCP"
    return wanted == port


def admits(policy: dict[str, Any], src: Pod, dest: Pod, port: int) -> bool:
    spec = policy["spec"]
    if dest.namespace != policy["metadata"]["namespace"] or not selects(spec["podSelector"], dest.labels):
        return True  # not selected: this policy isolates nothing
    return any(
        any(peer_admits(peer, dest.namespace, src) for peer in rule["from"])
        and any(port_admits(p, dest, port) for p in rule["ports"])
        for rule in spec.get("ingress", [])
    )


# ------------------------------------------------------------------ the pods


class Pod:
    def __init__(self, namespace: str, labels: dict[str, str], spec: dict[str, Any] | None = None) -> None:
        self.namespace, self.labels = namespace, labels
        containers = (spec or {}).get("containers", [])
        self.named_ports = {
            p["name"]: p["containerPort"] for c in containers for p in c.get("ports", []) if "name" in p
        }


def fleet_pods(name: str, namespace: str, index: int = 0) -> tuple[Pod, Pod, int, int]:
    """(replica ``index``, a gateway, the sidecar port, the engine port) of the example fleet renamed."""
    manifest = yaml.safe_load((ROOT / "examples" / "emulator-fleet.yaml").read_text())
    manifest["metadata"] = {"name": name, "namespace": namespace}
    spec = PrefixCacheFleet.model_validate(manifest).spec
    ref = planner.FleetRef(name=name, namespace=namespace, uid="uid-1")
    template, template_hash = planner.replica_template(ref, spec, REDIS)
    pod = planner.replica_pod(ref, template, template_hash, index)
    (deployment,) = [c for c in planner.desired_children(ref, spec, REDIS) if c["kind"] == "Deployment"]
    gateway = deployment["spec"]["template"]
    assert spec.engine.port is not None
    return (
        Pod(namespace, pod["metadata"]["labels"], pod["spec"]),
        Pod(namespace, gateway["metadata"]["labels"], gateway["spec"]),
        spec.sidecar.port,
        spec.engine.port,
    )


def operator_pod(chart: helm_python.Chart, release: str) -> Pod:
    manifests = chart.render({}, name=release, namespace=RELEASE_NS)
    (deployment,) = [
        o
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for o in yaml.safe_load_all(text)
        if o and o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
    ]
    return Pod(RELEASE_NS, deployment["spec"]["template"]["metadata"]["labels"])


@pytest.fixture(scope="module")
def chart_loaded() -> Any:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


def test_the_documented_policy_is_valid_kubernetes() -> None:
    kubernetes_validate.validate(documented_policy(), "1.33.0", strict=True)


def test_it_admits_gateways_sidecars_operator_and_prometheus_to_the_sidecar_port(
    chart_loaded: Any,
) -> None:
    policy = documented_policy()
    replica, gateway, sidecar_port, _ = fleet_pods(FLEET, FLEET_NS)
    other_replica, _, _, _ = fleet_pods(FLEET, FLEET_NS, index=1)
    prometheus = Pod(MONITORING_NS, {"app.kubernetes.io/name": "prometheus", "prometheus": "kps"})
    callers = {
        "gateway (requests)": gateway,
        "another replica's sidecar (pre-warm fetch)": other_replica,
        "the operator (warm, status, /metrics)": operator_pod(chart_loaded, "prefixfleet"),
        "Prometheus": prometheus,
    }
    for who, src in callers.items():
        assert admits(policy, src, replica, sidecar_port), f"{who} cannot reach the sidecar port"


def test_it_refuses_everyone_else_and_isolates_only_the_replicas(chart_loaded: Any) -> None:
    policy = documented_policy()
    replica, gateway, sidecar_port, engine_port = fleet_pods(FLEET, FLEET_NS)
    _, other_fleets_gateway, _, _ = fleet_pods("other", FLEET_NS)
    strangers = {
        "another pod of the namespace": Pod(FLEET_NS, {"app": "notebook"}),
        "another fleet's gateway": other_fleets_gateway,
        "a look-alike in another namespace": Pod("team-b", dict(gateway.labels)),
        "a pod of the operator's namespace": Pod(RELEASE_NS, {"app": "debug"}),
        "another release's operator": operator_pod(chart_loaded, "staging"),
        "a pod of the monitoring namespace": Pod(MONITORING_NS, {"app.kubernetes.io/name": "grafana"}),
    }
    for who, src in strangers.items():
        assert not admits(policy, src, replica, sidecar_port), f"{who} reaches the sidecar port"
    assert not admits(policy, gateway, replica, engine_port), "the engine port is admitted"
    # the gateways stay reachable by the fleet's clients: the policy selects the replicas only
    assert not selects(policy["spec"]["podSelector"], gateway.labels)
    assert selects(policy["spec"]["podSelector"], replica.labels)
