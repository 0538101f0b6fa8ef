"""A replica on an old template is published, scraped and warmed at the sidecar port its own pod spec
declares, not at a new spec.sidecar.port that only pods of the new template listen on."""

from __future__ import annotations

from typing import Any

from prefixfleet.operator.membership import desired_members
from prefixfleet.operator.models import FleetSpec, validate_spec
from prefixfleet.operator.planner import FleetRef, observe_pod, pod_url, replica_template

FLEET = FleetRef(name="f", namespace="default", uid="u")


def fleet_spec(sidecar_port: int) -> FleetSpec:
    return validate_spec(
        {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "sidecar": {"port": sidecar_port}}
    )


def running_pod(spec: FleetSpec, name: str, ip: str) -> dict[str, Any]:
    """A Ready pod as the API server lists it, made from the replica template of ``spec``."""
    template, _ = replica_template(FLEET, spec, "redis://r:6379/0")
    metadata = template["metadata"]
    return {
        "metadata": {
            "name": name,
            "labels": metadata["labels"],
            "annotations": {**metadata["annotations"]},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": template["spec"],
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_old_template_pod_is_published_at_the_port_it_listens_on() -> None:
    old, new = fleet_spec(8100), fleet_spec(9100)
    pods = [
        observe_pod(running_pod(old, "f-replica-0", "10.0.0.1")),
        observe_pod(running_pod(new, "f-replica-1", "10.0.0.2")),
    ]
    members = desired_members(new, pods, 0)
    assert members["f-replica-0"].url == "http://10.0.0.1:8100"
    assert members["f-replica-1"].url == "http://10.0.0.2:9100"


def test_the_port_map_is_keyed_by_the_pods_own_port() -> None:
    body = running_pod(fleet_spec(8100), "f-replica-0", "127.0.0.1")
    body["metadata"]["annotations"]["prefixfleet.io/port-map"] = '{"8100": 41001}'
    assert pod_url(observe_pod(body), 9100) == "http://127.0.0.1:41001"


def test_a_pod_without_a_declared_sidecar_port_falls_back_to_the_spec() -> None:
    body = running_pod(fleet_spec(8100), "f-replica-0", "10.0.0.1")
    del body["spec"]
    assert pod_url(observe_pod(body), 9100) == "http://10.0.0.1:9100"
