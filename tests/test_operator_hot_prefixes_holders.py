"""``status.hotPrefixes[].holders`` stays within the CRD's 256 items, however many pods hold a prefix.

The CRD caps each hot prefix's holders at 256 (``models.HotPrefix``), and kube-apiserver refuses a
status patch that breaks the cap (422). A shared system prompt is cached by every replica, so in a
fleet of more than 256 replicas the hottest prefix had more holders than that: the autoscaler's
status patch of every round was refused (the round failed with the API server's error, and
``lastScaleTime``, the planner's memory and its decision were never written). The status now names
the first 256 holders (sorted), as the emulated API server checks here with the CRD's schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from prefixfleet.operator.autoscale import SubtreeObservation
from prefixfleet.operator.autoscale_observe import hot_prefixes_status
from prefixfleet.operator.models import FleetStatus
from tests.k8s.cluster import EmulatedCluster

GROUP, VERSION, PLURAL = "prefixfleet.io", "v1alpha1", "prefixcachefleets"
PODS = [f"big-replica-{i}" for i in range(300)]


@pytest.fixture
def custom(tmp_path: Path) -> Iterator[kubernetes.client.CustomObjectsApi]:
    cluster = EmulatedCluster(tmp_path / "cluster")
    try:
        cluster.install_crd()
        api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
        custom = kubernetes.client.CustomObjectsApi(api)
        manifest = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PrefixCacheFleet",
            "metadata": {"name": "big"},
            "spec": {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 300},
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, manifest)
        yield custom
    finally:
        cluster.close()


def test_a_prefix_every_one_of_300_replicas_holds_is_a_status_the_api_server_takes(
    custom: kubernetes.client.CustomObjectsApi,
) -> None:
    shared = SubtreeObservation("00000000000000aa", tokens=512, rate_rps=40.0, holders=frozenset(PODS))
    rare = SubtreeObservation("00000000000000bb", tokens=64, rate_rps=1.0, holders=frozenset(PODS[:2]))
    hot = hot_prefixes_status([shared, rare])
    # the status subresource validates against the CRD's schema (maxItems 256): 422 before
    body = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "big", {"status": {"hotPrefixes": hot}}
    )
    stored = body["status"]["hotPrefixes"]
    assert stored[0]["holders"] == sorted(PODS)[:256]
    assert stored[1]["holders"] == sorted(PODS[:2])
    FleetStatus.model_validate({"hotPrefixes": hot})  # the models' cap too
