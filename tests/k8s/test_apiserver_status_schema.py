"""The emulated API server prunes, defaults and validates a custom resource's ``status`` against its
CRD's ``openAPIV3Schema``, as kube-apiserver does, on ``/status`` and on the main endpoint."""

from __future__ import annotations

import json

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.k8s.apiserver import list_map_errors, prune_unknown
from tests.k8s.cluster import CRD_FILE, EmulatedCluster

GROUP, VERSION, PLURAL = "prefixfleet.io", "v1alpha1", "prefixcachefleets"
CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "AllReady",
    "lastTransitionTime": "2026-12-01T20:00:00Z",
}


@pytest.fixture
def custom(cluster: EmulatedCluster) -> kubernetes.client.CustomObjectsApi:
    cluster.install_crd()
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    custom = kubernetes.client.CustomObjectsApi(api)
    manifest = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PrefixCacheFleet",
        "metadata": {"name": "f"},
        "spec": {"model": {"name": "emulated-llm"}, "engine": {"kind": "emulator"}, "replicas": 1},
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, manifest)
    return custom


def patch_status(custom: kubernetes.client.CustomObjectsApi, status: dict) -> dict:
    return custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "f", {"status": status}
    )


def refusal(custom: kubernetes.client.CustomObjectsApi, status: dict) -> dict:
    with pytest.raises(ApiException) as refused:
        patch_status(custom, status)
    assert refused.value.status == 422
    return json.loads(refused.value.body)


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"replicas": -1}, "status.replicas"),
        ({"hitRate": 1.5}, "status.hitRate"),
        ({"selector": 3}, "status.selector"),
        ({"conditions": [{**CONDITION, "type": "Sleepy"}]}, "status.conditions[0].type"),
        ({"conditions": [{"type": "Ready", "status": "True"}]}, "status.conditions[0].reason"),
        ({"conditions": [CONDITION, CONDITION]}, "status.conditions[1]"),
        ({"engineMetrics": {"source": "guess"}}, "status.engineMetrics.source"),
        ({"hotPrefixes": [{"hash": "ab", "tokens": 1, "rate": 0.1}] * 101}, "status.hotPrefixes"),
    ],
)
def test_an_invalid_status_is_refused_naming_the_field(
    custom: kubernetes.client.CustomObjectsApi, status: dict, field: str
) -> None:
    body = refusal(custom, status)
    assert body["reason"] == "Invalid" and body["details"]["kind"] == "PrefixCacheFleet"
    assert field in [cause["field"] for cause in body["details"]["causes"]], body
    # Nothing was stored.
    assert "status" not in custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "f")


def test_unknown_status_fields_are_pruned_and_kopf_is_kept(
    custom: kubernetes.client.CustomObjectsApi,
) -> None:
    written = patch_status(
        custom,
        {
            "replicas": 2,
            "kopf": {"progress": {"create": {"started": "x"}}},  # status preserves unknown fields
            "conditions": [{**CONDITION, "colour": "green"}],  # a condition does not
            "engineMetrics": {"source": "scrape", "why": "x"},
        },
    )
    status = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "f")["status"]
    assert written["status"] == status
    assert status["kopf"] == {"progress": {"create": {"started": "x"}}}
    assert "colour" not in status["conditions"][0] and "why" not in status["engineMetrics"]
    # Schema defaults are filled in, as the API server does.
    assert status["readyReplicas"] == 0 and status["conditions"][0]["message"] == ""


def test_the_switch_turns_status_checks_off(
    cluster: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    cluster.api.server.validate_custom_status = False
    assert patch_status(custom, {"replicas": -1, "colour": "x"})["status"] == {"replicas": -1, "colour": "x"}


def test_the_real_crd_preserves_unknown_status_fields_at_the_top_only() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True
    pruned = prune_unknown(status, {"kopf": {"a": 1}, "engineMetrics": {"source": "none", "b": 2}})
    assert pruned == {"kopf": {"a": 1}, "engineMetrics": {"source": "none"}}
    assert list_map_errors(status, {"conditions": [CONDITION, {**CONDITION, "status": "False"}]}) == [
        'conditions[1]: Duplicate value: {"type":"Ready"}'
    ]
