"""A Redis password the operator reads from a Secret never lands in a manifest it writes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from tests.k8s.cluster import EmulatedCluster

PASSWORD = "p@ss:w/rd"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Kube]:
    cluster = EmulatedCluster(tmp_path / "cluster")
    try:
        cluster.install_crd()
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-auth"},
                  "data": {"password": base64.b64encode(PASSWORD.encode()).decode()}}  # fmt: skip
        cluster.apply(json.dumps(secret))
        yield Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    finally:
        cluster.close()


def test_pods_and_router_get_the_password_by_reference_only(kube: Kube) -> None:
    ctx = OperatorContext(kube=kube, default_redis_url="redis://default:6379/0")
    fleet = {"apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet",
             "metadata": {"name": "f", "namespace": "default"},
             "spec": {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 1,
                      "redis": {"passwordSecretRef": {"name": "redis-auth", "key": "password"}}}}  # fmt: skip
    kube.create(fleet)
    reconcile_in_cluster(ctx, "default", "f")  # Redis is unreachable here: only the manifests matter
    written = [
        *kube.list("Pod", "default", "prefixfleet.io/fleet=f"),
        kube.get("Deployment", "default", "f-router"),
    ]
    text = json.dumps(written)
    assert "p@ss" not in text and "p%40ss" not in text
    assert "redis://default:6379/0" in text  # the URL without credentials
    assert "PREFIXFLEET_REDIS_PASSWORD" in text  # the password by secretKeyRef
