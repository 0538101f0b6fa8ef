"""The operator's own Redis connection honours ``spec.redis.passwordSecretRef`` and ``tls``.

The Secret is read from the (emulated) API server the way the operator reads it in a cluster; the
resulting URL carries the password only in memory (never in a log line: the default URL is logged
redacted). Pure URL handling is checked alongside.
"""

from __future__ import annotations

import base64
from pathlib import Path

import kubernetes
import pytest

from prefixfleet.operator.handlers import OperatorContext, resolve_redis_url
from prefixfleet.operator.kube import Kube
from prefixfleet.router.redis_conn import redacted, with_credentials
from tests.k8s.cluster import EmulatedCluster


@pytest.fixture
def kube_with_secrets(tmp_path: Path):
    cluster = EmulatedCluster(tmp_path / "cluster")
    try:
        for name, key, value in (
            ("redis-auth", "password", "p@ss:w/rd"),
            ("redis-url", "url", "redis://r:6379/2"),
        ):
            cluster.apply(
                "apiVersion: v1\nkind: Secret\nmetadata:\n"
                f"  name: {name}\n  namespace: default\n"
                f"data:\n  {key}: {base64.b64encode(value.encode()).decode()}\n"
            )
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=config)
        yield Kube(kubernetes.client.ApiClient(config))
    finally:
        cluster.close()


def test_the_operator_reads_the_redis_password_and_tls_from_the_fleet_spec(kube_with_secrets):
    ctx = OperatorContext(kube=kube_with_secrets, default_redis_url="redis://default:6379/0")
    password = {"passwordSecretRef": {"name": "redis-auth", "key": "password"}}
    assert resolve_redis_url(ctx, "default", {"redis": {"url": "redis://r:6379/0", **password}}) == (
        "redis://:p%40ss%3Aw%2Frd@r:6379/0"
    )
    assert resolve_redis_url(ctx, "default", {"redis": {"url": "redis://r:6379/0", "tls": True}}) == (
        "rediss://r:6379/0"
    )
    from_secret = {"secretRef": {"name": "redis-url", "key": "url"}, **password, "tls": True}
    assert resolve_redis_url(ctx, "default", {"redis": from_secret}) == "rediss://:p%40ss%3Aw%2Frd@r:6379/2"
    assert resolve_redis_url(ctx, "default", {}) == "redis://default:6379/0"


def test_with_credentials_keeps_an_existing_password_and_redacted_hides_it():
    assert with_credentials("redis://:mine@h:1/0", "other") == "redis://:mine@h:1/0"
    assert with_credentials("redis://user@h:1/0", "pw") == "redis://user:pw@h:1/0"
    assert with_credentials("unix:///tmp/r.sock", "pw") == "unix:///tmp/r.sock"
    assert redacted("redis://:p%40ss@h:1/0") == "redis://:***@h:1/0"
    assert redacted("redis://h:1/0") == "redis://h:1/0"
