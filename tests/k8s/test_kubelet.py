"""The kubelet shim runs a Pod's `prefixfleet ...` containers as processes and reports readiness."""

from __future__ import annotations

import json
import os

import httpx
import kubernetes
from kubernetes.client.rest import ApiException

from tests.k8s.cluster import EmulatedCluster, wait_for
from tests.k8s.kubelet import PORT_MAP_ANNOTATION, expand_vars, remap_ports


def emulator_pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"app": "emu"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "prefixfleet:test",
                    "command": ["prefixfleet", "emulator"],
                    "args": [
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "30000",
                        "--model",
                        "$(MODEL)",
                        "--time-scale",
                        "50",
                    ],
                    # as in Kubernetes, a value may refer to variables defined before it
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "MODEL", "value": "m-$(POD_NAME)"},
                    ],
                    "ports": [{"name": "http", "containerPort": 30000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                }
            ]
        },
    }


def test_port_and_variable_rewriting() -> None:
    ports = {30000: 41000, 8100: 41001}
    assert remap_ports("30000", "--port", ports) == "41000"
    assert remap_ports("--port=8100", None, ports) == "--port=41001"
    assert remap_ports("http://127.0.0.1:30000", "--engine", ports) == "http://127.0.0.1:41000"
    assert remap_ports("http://10.0.0.7:8100/x", None, ports) == "http://10.0.0.7:41001/x"
    assert remap_ports("0.0.0.0", "--host", ports) == "127.0.0.1"
    assert (
        expand_vars("http://$(POD_IP):8100 $(UNKNOWN)", {"POD_IP": "1.2.3.4"})
        == "http://1.2.3.4:8100 $(UNKNOWN)"
    )


def test_pod_runs_becomes_ready_and_dies_with_deletion(cluster: EmulatedCluster) -> None:
    cluster.start_kubelet()
    core = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    )
    core.create_namespaced_pod("default", emulator_pod("emu-0"))

    def ready_pod() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("emu-0", "default")
        conditions = {c.type: c.status for c in (pod.status.conditions or [])} if pod.status else {}
        return pod if conditions.get("Ready") == "True" else None

    pod = wait_for(ready_pod, 30, what="pod emu-0 Ready")
    assert pod.status.phase == "Running" and pod.status.pod_ip == "127.0.0.1"
    port = json.loads(pod.metadata.annotations[PORT_MAP_ANNOTATION])["30000"]
    info = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
    assert info["data"][0]["id"] == "m-emu-0"  # $(MODEL) expanded through $(POD_NAME)
    assert cluster.kubelet is not None
    pid = cluster.kubelet.kubelet.pods["default/emu-0"].children["engine"].pid

    core.delete_namespaced_pod("emu-0", "default")

    def process_gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(process_gone, 15, what="the engine process to exit after the pod was deleted")
    try:
        core.read_namespaced_pod("emu-0", "default")
        raise AssertionError("pod still exists")
    except ApiException as exc:
        assert exc.status == 404


def phase(core: kubernetes.client.CoreV1Api, name: str) -> str | None:
    status = core.read_namespaced_pod(name, "default").status
    return status.phase if status else None


def test_a_container_that_exits_fails_a_never_restarting_pod(cluster: EmulatedCluster) -> None:
    cluster.start_kubelet()
    core = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    )
    pod = emulator_pod("bad-0")
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["args"] = ["--port", "not-a-port"]  # the emulator refuses it: exit 2
    core.create_namespaced_pod("default", pod)
    wait_for(lambda: phase(core, "bad-0") == "Failed", 30, what="the pod to fail")
    status = core.read_namespaced_pod("bad-0", "default").status
    assert "exited with 2" in status.message


def test_a_non_prefixfleet_command_is_refused_with_a_reason(cluster: EmulatedCluster) -> None:
    cluster.start_kubelet()
    core = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    )
    pod = emulator_pod("gpu-0")
    pod["spec"]["containers"][0]["command"] = ["python3", "-m", "sglang.launch_server"]
    core.create_namespaced_pod("default", pod)
    wait_for(lambda: phase(core, "gpu-0") == "Failed", 15, what="the pod to fail")
    assert core.read_namespaced_pod("gpu-0", "default").status.reason == "UnsupportedCommand"


def test_env_from_secrets_and_config_maps(cluster: EmulatedCluster) -> None:
    cluster.start_kubelet()
    core = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    )
    core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "data": {"model": "c2VjcmV0LW0="}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"rev": "r7"}})
    pod = emulator_pod("env-0")
    container = pod["spec"]["containers"][0]
    container["env"] = [
        {"name": "MODEL", "valueFrom": {"secretKeyRef": {"name": "s", "key": "model"}}},
        {"name": "REV", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "rev"}}},
    ]
    container["args"] += ["--model-revision", "$(REV)"]
    core.create_namespaced_pod("default", pod)
    wait_for(lambda: phase(core, "env-0") == "Running", 30, what="the pod to run")
    port = json.loads(core.read_namespaced_pod("env-0", "default").metadata.annotations[PORT_MAP_ANNOTATION])[
        "30000"
    ]
    models = wait_for(lambda: _models(port), 20, what="the emulator to answer")
    assert models["data"][0]["id"] == "secret-m"


def _models(port: int) -> dict | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()
    except httpx.HTTPError:
        return None
