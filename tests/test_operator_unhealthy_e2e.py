"""A hung engine is replaced, end to end in the emulated cluster: the operator process (kopf), the
kubelet shim running engine emulators + sidecars as processes, kubectl, Valkey.

Specification (a two-replica fleet with ``spec.engine.replaceUnreadyAfterSeconds: 2``):
* both replicas come up Ready, and the operator marks each ``prefixfleet.io/first-ready``;
* replica 0's engine freezes (SIGSTOP: the process lives and accepts connections but answers
  nothing, as a hung engine does); its sidecar's ``/health``, proxied to the engine, stops answering,
  so the kubelet turns the pod unready; no probe restarts the engine (it listens on loopback);
* after the allowance the operator deletes that pod and the reconcile recreates it (a new pod of the
  same name, another uid); replica 1 is left alone; the fleet is Ready with 2 replicas again;
* a Warning Event ``ReplicaUnhealthy`` names the pod and how long it was unready, and the operator's
  ``prefixfleet_operator_unhealthy_replacements_total{reason="unready"}`` counts it;
* deleted, the fleet leaves no ``prefixfleet_operator_unavailable_replicas`` series behind.

With ``replaceUnreadyAfterSeconds: 0`` (and the autoscaler on) the hung pod is kept: the autoscaler
adds a replica for it, and the fleet says so: ``Degraded=True``, reason ``ReplicaUnavailable``, naming
the pod, one Warning Event ``ReplicaUnavailable`` however many reconciles it stays hung, and
``prefixfleet_operator_unavailable_replicas`` 1. Made invalid (``Degraded`` InvalidSpec: nothing is
planned or replaced), the fleet's gauge still follows its pods: 1 while the pod hangs, 0 once it answers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fleet_fixtures import free_port
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s.cluster import (
    REPO,
    EmulatedCluster,
    OperatorProcess,
    operator_in_cluster,
    running_redis,
    wait_for,
)

pytestmark = pytest.mark.slow

FLEET = "hang"
SELECTOR = f"prefixfleet.io/fleet={FLEET},prefixfleet.io/role=replica"
HUNG = f"{FLEET}-replica-0"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[EmulatedCluster, OperatorProcess, int]]:
    metrics_port = free_port()
    with (
        running_redis(tmp_path) as redis_url,
        operator_in_cluster(tmp_path, redis_url, extra_args=["--metrics-port", str(metrics_port)]) as (
            cluster,
            operator,
        ),
    ):
        yield cluster, operator, metrics_port


def fleet_manifest() -> str:
    fleet = yaml.safe_load((REPO / "examples" / "emulator-fleet.yaml").read_text())
    fleet["metadata"]["name"] = FLEET
    fleet["spec"]["replicas"] = 2
    fleet["spec"]["autoscaling"] = {"enabled": False}
    fleet["spec"]["router"] = {"replicas": 0}  # not needed here: fewer processes on a shared machine
    fleet["spec"]["engine"]["args"] = ["--time-scale", "50", "--cache-tokens", "20000"]
    fleet["spec"]["engine"]["replaceUnreadyAfterSeconds"] = 2
    return yaml.safe_dump(fleet)


def replica_pods(cluster: EmulatedCluster) -> dict[str, dict[str, Any]]:
    items = cluster.kubectl_json("get", "pods", "-l", SELECTOR)["items"]
    return {p["metadata"]["name"]: p for p in items}


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def all_ready(cluster: EmulatedCluster) -> dict[str, dict[str, Any]] | None:
    """The replica pods once the fleet is Ready with both of them Ready and marked as having served."""
    pods = replica_pods(cluster)
    status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
    fleet_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
    marked = all("prefixfleet.io/first-ready" in p["metadata"].get("annotations", {}) for p in pods.values())
    if fleet_ready and len(pods) == 2 and all(is_ready(p) for p in pods.values()) and marked:
        return pods
    return None


def replacements(metrics_port: int) -> dict[str, float]:
    # a bound, not an expectation (was 5 s): the operator answers slowly on a loaded machine
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).text
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "prefixfleet_operator_unhealthy_replacements_total" and s.labels.get("fleet") == FLEET
    }


def unavailable_gauge(metrics_port: int) -> float | None:
    """prefixfleet_operator_unavailable_replicas of the fleet; None when the series is absent."""
    # a bound, not an expectation (was 5 s): the operator answers slowly on a loaded machine
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).text
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "prefixfleet_operator_unavailable_replicas" and s.labels.get("fleet") == FLEET
    ]
    return values[0] if values else None


@pytest.mark.timeout(300)
def test_a_replica_whose_engine_hangs_is_replaced(env: tuple[EmulatedCluster, OperatorProcess, int]) -> None:
    cluster, _, metrics_port = env
    cluster.apply(fleet_manifest())
    before = wait_for(lambda: all_ready(cluster), 90, what="2 Ready replicas, marked first-ready")
    uids = {name: p["metadata"]["uid"] for name, p in before.items()}

    # freeze the engine of replica 0: the process stays, its port accepts and never answers
    assert cluster.kubelet is not None
    engine = cluster.kubelet.kubelet.pods[f"default/{HUNG}"].children["engine"]
    os.killpg(engine.pid, signal.SIGSTOP)

    wait_for(lambda: not is_ready(replica_pods(cluster).get(HUNG, {"status": {}})) or None, 30,
             what="the hung replica to turn unready")  # fmt: skip

    # the operator replaces it: a new pod of the same name, Ready, and the fleet is whole again
    def replaced() -> dict[str, dict[str, Any]] | None:
        pods = all_ready(cluster)
        return pods if pods and pods[HUNG]["metadata"]["uid"] != uids[HUNG] else None

    # 120 s: alone it takes ~20 s, but the replacement pod's start waits on a loaded machine's CPU
    after = wait_for(replaced, 120, what="the hung replica to be replaced and the fleet Ready again")
    assert after[f"{FLEET}-replica-1"]["metadata"]["uid"] == uids[f"{FLEET}-replica-1"]  # left alone

    events = cluster.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={FLEET}")[
        "items"
    ]
    unhealthy = [e for e in events if e["reason"] == "ReplicaUnhealthy"]
    assert len(unhealthy) == 1 and unhealthy[0]["type"] == "Warning"
    message = unhealthy[0]["message"]
    assert f"pod {HUNG} was Ready, then unready for" in message and "replaceUnreadyAfterSeconds=2" in message

    assert replacements(metrics_port) == {"unready": 1.0}  # counted when it replaced the pod
    # replaced, so none is left unavailable: the gauge follows the pods the operator observed at its
    # last reconcile, which may come a moment after the new pod turned Ready (wait, don't sample once)
    wait_for(lambda: unavailable_gauge(metrics_port) == 0.0 or None, 30,
             what="prefixfleet_operator_unavailable_replicas 0 after the replacement")  # fmt: skip

    # a deleted fleet (not autoscaled: the autoscaler's forget never sees it) leaves no series behind
    cluster.kubectl("delete", "pcf", FLEET, "--timeout=30s")
    wait_for(lambda: unavailable_gauge(metrics_port) is None or None, 30,
             what="the deleted fleet's unavailable_replicas series to go")  # fmt: skip


def fleet_degraded_reason(cluster: EmulatedCluster) -> str:
    conditions = (cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}).get("conditions", [])
    return next((c["reason"] for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), "")


def autoscaled_manifest() -> str:
    """The fleet with replacing off and the autoscaler on (two replicas at least, three at most)."""
    fleet = yaml.safe_load(fleet_manifest())
    fleet["spec"]["engine"]["replaceUnreadyAfterSeconds"] = 0
    fleet["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 2, "maxReplicas": 3, "intervalSeconds": 1}
    return yaml.safe_dump(fleet)


@pytest.mark.timeout(180)
def test_a_hung_replica_nothing_replaces_is_made_up_for_by_the_autoscaler(
    env: tuple[EmulatedCluster, OperatorProcess, int],
) -> None:
    # replaceUnreadyAfterSeconds: 0 keeps the hung pod; it is no capacity and no replacement is on its
    # way, so the autoscaler adds a pod to keep minReplicas (2) serving, within maxReplicas (3)
    cluster, _, metrics_port = env
    cluster.apply(autoscaled_manifest())
    before = wait_for(lambda: all_ready(cluster), 90, what="2 Ready replicas, marked first-ready")
    assert cluster.kubelet is not None
    engine = cluster.kubelet.kubelet.pods[f"default/{HUNG}"].children["engine"]
    os.killpg(engine.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not is_ready(replica_pods(cluster).get(HUNG, {"status": {}})) or None, 30,
                 what="the hung replica to turn unready")  # fmt: skip

        def made_up() -> dict[str, dict[str, Any]] | None:
            pods = replica_pods(cluster)
            serving = sorted(n for n, p in pods.items() if is_ready(p))
            wanted = cluster.kubectl_json("get", "pcf", FLEET)["spec"]["replicas"]
            return pods if wanted == 3 and len(serving) == 2 and HUNG not in serving else None

        after = wait_for(made_up, 90, what="the autoscaler to add a replica for the hung one")
        assert after[HUNG]["metadata"]["uid"] == before[HUNG]["metadata"]["uid"]  # kept: replacing is off
        status = cluster.kubectl_json("get", "pcf", FLEET)["status"]
        assert f"no replacement coming: {HUNG}" in status["lastScaleReason"]
        assert replacements(metrics_port) == {}
        # Grafana/Alertmanager see it too (PrefixfleetReplicaUnavailable): the hung pod counts once
        wait_for(lambda: unavailable_gauge(metrics_port) == 1.0 or None, 30,
                 what="prefixfleet_operator_unavailable_replicas 1")  # fmt: skip

        # the fleet says it is short of a replica nothing replaces (it looked healthy before)
        (degraded,) = (c for c in status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "ReplicaUnavailable")
        assert f"no replacement coming: {HUNG} unready after serving since" in degraded["message"]
        assert "replaceUnreadyAfterSeconds is 0" in degraded["message"]

        # once for this unready stretch, not once per reconcile (there were many meanwhile)
        def unavailable_events() -> list[dict[str, Any]]:
            events = cluster.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={FLEET}")
            return [e for e in events["items"] if e["reason"] == "ReplicaUnavailable"]

        unavailable = wait_for(unavailable_events, 30, what="a ReplicaUnavailable Event")
        assert len(unavailable) == 1 and unavailable[0]["type"] == "Warning"
        assert f"pod {HUNG} was Ready, is unready since" in unavailable[0]["message"]

        # a spec the operator refuses (one that got past a server without schema validation) stops
        # every plan, replacements too; the gauge still follows the pods it observes, not its last plan
        cluster.api.server.validate_custom_resources = False
        cluster.kubectl("patch", "pcf", FLEET, "--type", "merge", "-p", '{"spec":{"engine":{"kind":"tpu"}}}')
        wait_for(lambda: fleet_degraded_reason(cluster) == "InvalidSpec" or None, 30,
                 what="Degraded InvalidSpec")  # fmt: skip
        assert unavailable_gauge(metrics_port) == 1.0  # still hung, and nothing replaces it
        os.killpg(engine.pid, signal.SIGCONT)  # it answers again: Ready, so no longer unavailable
        wait_for(lambda: unavailable_gauge(metrics_port) == 0.0 or None, 30,
                 what="prefixfleet_operator_unavailable_replicas 0 under an invalid spec")  # fmt: skip
    finally:
        os.killpg(engine.pid, signal.SIGCONT)  # a stopped process would hold up teardown
