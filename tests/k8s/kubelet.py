"""A kubelet shim for the emulated cluster: runs Pods' (and Deployments') containers as local processes.

There is no container runtime here, so the shim maps each container of the project's image to a
process of the installed ``prefixfleet`` command:

* ``command[0] == "prefixfleet"`` runs ``.venv/bin/prefixfleet`` with the remaining command and
  ``args``; any other command makes the Pod ``Failed`` with reason ``UnsupportedCommand`` (no
  SGLang/vLLM here — use the ``emulator`` engine kind).
* ``$(VAR)`` references in command/args expand from the container's ``env`` (``value``, the
  downward-API ``fieldRef`` paths ``metadata.name``, ``metadata.namespace``, ``status.podIP``,
  ``spec.nodeName``, and ``secretKeyRef``/``configMapKeyRef`` read through the API), as Kubernetes
  does.
* Every pod shares one network namespace in Kubernetes, so containers reach each other on
  ``127.0.0.1:<containerPort>``. Here all pods share the host's loopback, so each declared
  ``containerPort`` of a pod gets its own free loopback port, and the shim rewrites, in every
  argument, ``--port N`` / ``--port=N`` and every ``:N`` that ends an address (``127.0.0.1:N``,
  ``$(POD_IP):N``) to the mapped port; ``--host X`` becomes ``--host 127.0.0.1``.
* It writes back ``status.podIP: 127.0.0.1``, ``phase: Running`` and the ``Ready`` condition once
  every container with an ``httpGet`` readiness probe answers it (containers without a probe are
  ready when started), and keeps probing: a failing probe turns ``Ready`` False again. As a kubelet
  does, each condition carries the ``lastTransitionTime`` of its last change of status, and each
  running container its ``state.running.startedAt`` (a restart starts it again). The port
  mapping is published as the annotation ``prefixfleet.io/port-map`` (JSON ``{"containerPort":
  hostPort}``) so clients can reach the pod's real addresses; the operator honours it.
* A container that exits is restarted (``restartPolicy: Always``, ``restartCount`` increments) or
  fails the Pod (``Never``/``OnFailure`` when non-zero); deleting the Pod kills its processes.
* Deployments: there is no Deployment controller, so the shim runs ``spec.replicas`` instances of
  the template directly (no Pod objects), reports ``status.replicas/readyReplicas`` and publishes
  the instances' port maps as the annotation ``prefixfleet.io/port-maps`` (a JSON list).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from fleet_fixtures import free_port

from prefixfleet.fleet.processes import Child, Supervisor

JSON = dict[str, Any]
PORT_MAP_ANNOTATION = "prefixfleet.io/port-map"
PORT_MAPS_ANNOTATION = "prefixfleet.io/port-maps"
PROBE_INTERVAL_S = 0.5
MAX_RESTARTS = 5


def pick_host_port(taken: set[int]) -> int:
    """A free loopback port for a pod, not handed out before: from this pytest-xdist worker's block
    below the kernel's ephemeral range (fleet_fixtures.free_port), so neither an outgoing connection
    nor another worker's pod or server can take it between picking and binding (bounded tries)."""
    for _ in range(200):
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("no free loopback port found for a pod")


def prefixfleet_executable() -> Path:
    return Path(sys.executable).parent / "prefixfleet"


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion; unknown references stay as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def remap_ports(arg: str, previous: str | None, port_map: dict[int, int]) -> str:
    """Rewrite container ports in one argument to their host ports (see the module docstring)."""
    if previous == "--host":
        return "127.0.0.1"  # everything here stays on loopback, whatever the pod binds in a cluster
    if previous == "--port" and arg.isdigit() and int(arg) in port_map:
        return str(port_map[int(arg)])
    if m := re.fullmatch(r"--port=(\d+)", arg):
        port = int(m.group(1))
        return f"--port={port_map.get(port, port)}"

    def repl(m: re.Match[str]) -> str:
        port = int(m.group(1))
        return f":{port_map.get(port, port)}"

    return re.sub(r":(\d+)(?=$|/|\s|,)", repl, arg)


def container_env(
    container: JSON, pod: JSON, pod_ip: str, key_values: dict[tuple[str, str, str], str] | None = None
) -> dict[str, str]:
    """The container's environment; ``key_values`` holds the Secret/ConfigMap keys it refers to
    as ``{("secret"|"configmap", name, key): value}`` (fetched by the caller)."""
    field_values = {
        "metadata.name": pod.get("metadata", {}).get("name", ""),
        "metadata.namespace": pod.get("metadata", {}).get("namespace", ""),
        "status.podIP": pod_ip,
        "status.hostIP": pod_ip,
        "spec.nodeName": "emulated-node",
    }
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand_vars(str(item["value"]), env)
        elif (ref := (item.get("valueFrom") or {}).get("fieldRef")) is not None:
            env[item["name"]] = field_values.get(ref.get("fieldPath", ""), "")
        else:
            for kind, source in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
                if (ref := (item.get("valueFrom") or {}).get(source)) is not None:
                    value = (key_values or {}).get((kind, ref.get("name", ""), ref.get("key", "")))
                    if value is not None:
                        env[item["name"]] = value
    return env


def key_refs(container: JSON) -> list[tuple[str, str, str]]:
    """The (kind, name, key) of every Secret/ConfigMap key the container's env refers to."""
    out = []
    for item in container.get("env") or []:
        value_from = item.get("valueFrom") or {}
        for kind, source in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
            if (ref := value_from.get(source)) is not None:
                out.append((kind, ref.get("name", ""), ref.get("key", "")))
    return out


def container_argv(
    container: JSON, env: dict[str, str], port_map: dict[int, int], executable: Path
) -> list[str]:
    raw = [
        expand_vars(str(a), env) for a in [*(container.get("command") or []), *(container.get("args") or [])]
    ]
    if not raw or raw[0] != "prefixfleet":
        raise ValueError(
            f"container {container.get('name')!r}: only 'prefixfleet ...' commands run here, got {raw[:3]}"
        )
    argv = [str(executable)]
    previous: str | None = None
    for arg in raw[1:]:
        argv.append(remap_ports(arg, previous, port_map))
        previous = arg
    return argv


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def declared_ports(spec: JSON) -> list[int]:
    return sorted({p["containerPort"] for c in spec.get("containers", []) for p in c.get("ports") or []})


@dataclass
class Instance:
    """One running pod (or one Deployment instance): its processes and port map."""

    key: str
    port_map: dict[int, int]
    children: dict[str, Child] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    started: dict[str, str] = field(default_factory=dict)  # container -> startedAt (RFC 3339)
    ready: bool = False
    failed: str | None = None
    task: asyncio.Task[None] | None = None


class Kubelet:
    """Watches Pods and Deployments through the API and runs their containers (see module docs)."""

    def __init__(
        self,
        api_url: str,
        run_dir: Path,
        executable: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.run_dir = run_dir
        self.executable = executable or prefixfleet_executable()
        self.extra_env = dict(extra_env or {})
        self.pods: dict[str, Instance] = {}
        self.deployments: dict[str, list[Instance]] = {}
        self._deployment_hash: dict[str, str] = {}
        self.supervisor = Supervisor(run_dir, stop_timeout_s=3)
        self.ports: set[int] = set()  # host ports handed out (never reused within a run)
        self.session: aiohttp.ClientSession | None = None

    # -- API -------------------------------------------------------------------------------------

    async def _patch(self, path: str, body: JSON) -> None:
        assert self.session is not None
        async with self.session.patch(
            self.api_url + path, json=body, headers={"Content-Type": "application/merge-patch+json"}
        ) as resp:
            if resp.status not in (200, 404):
                raise RuntimeError(f"PATCH {path}: {resp.status} {await resp.text()}")

    async def _watch(self, path: str, on_event: Callable[[str, JSON], Any]) -> None:
        """List+watch forever (re-listing when a stream ends), delivering every event in order."""
        assert self.session is not None
        while True:
            try:
                async with self.session.get(self.api_url + path) as resp:
                    listing = await resp.json()
                seen = set()
                for obj in listing.get("items", []):
                    seen.add((obj["metadata"].get("namespace"), obj["metadata"]["name"]))
                    await on_event("ADDED", obj)
                await on_event("RESYNC", {"seen": seen})
                rv = listing["metadata"]["resourceVersion"]
                url = f"{self.api_url}{path}?watch=true&resourceVersion={rv}&timeoutSeconds=30"
                async with self.session.get(
                    url, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)
                ) as resp:
                    async for line in resp.content:
                        if line.strip():
                            event = json.loads(line)
                            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                                await on_event(event["type"], event["object"])
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
                await asyncio.sleep(0.2)

    # -- pods ------------------------------------------------------------------------------------

    async def _on_pod(self, kind: str, pod: JSON) -> None:
        if kind == "RESYNC":
            for key in [k for k in self.pods if tuple(k.split("/", 1)) not in pod["seen"]]:
                await self._stop_instance(self.pods.pop(key))
            return
        meta = pod["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        current = self.pods.get(key)
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if current is not None:
                await self._stop_instance(self.pods.pop(key))
            return
        if current is not None and current.key != meta.get("uid"):  # replaced by a new pod of that name
            await self._stop_instance(self.pods.pop(key))
            current = None
        if current is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            instance = Instance(
                meta.get("uid", key), {p: pick_host_port(self.ports) for p in declared_ports(pod["spec"])}
            )
            self.pods[key] = instance
            instance.task = asyncio.create_task(self._run_pod(key, pod, instance))

    def _pod_path(self, pod: JSON, subresource: str = "") -> str:
        meta = pod["metadata"]
        return f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}{subresource}"

    async def _start_container(self, name: str, container: JSON, pod: JSON, instance: Instance) -> None:
        env = container_env(container, pod, "127.0.0.1", await self._key_values(container, pod))
        argv = container_argv(container, env, instance.port_map, self.executable)
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", instance.key)[-12:]
        log_name = f"{pod['metadata']['name']}-{tag}-{name}-{instance.restarts.get(name, 0)}"
        instance.children[name] = await self.supervisor.start(log_name, argv, env={**env, **self.extra_env})
        instance.started[name] = now_rfc3339()

    async def _key_values(self, container: JSON, pod: JSON) -> dict[tuple[str, str, str], str]:
        """Fetch the Secret/ConfigMap keys the env refers to (missing ones stay unset)."""
        assert self.session is not None
        namespace = pod.get("metadata", {}).get("namespace") or "default"
        out: dict[tuple[str, str, str], str] = {}
        for kind, name, key in key_refs(container):
            plural = "secrets" if kind == "secret" else "configmaps"
            async with self.session.get(
                f"{self.api_url}/api/v1/namespaces/{namespace}/{plural}/{name}"
            ) as resp:
                if resp.status != 200:
                    continue
                data = (await resp.json()).get("data") or {}
            if key in data:
                out[(kind, name, key)] = (
                    base64.b64decode(data[key]).decode() if kind == "secret" else data[key]
                )
        return out

    async def _probe(self, container: JSON, instance: Instance) -> bool:
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            return True
        port = probe.get("port")
        if isinstance(port, str):  # a named port
            port = next(
                (p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None
            )
        host_port = instance.port_map.get(int(port or 0), port)
        assert self.session is not None
        try:
            async with self.session.get(
                f"http://127.0.0.1:{host_port}{probe.get('path', '/')}",
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                return 200 <= resp.status < 400
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _run_pod(self, key: str, pod: JSON, instance: Instance) -> None:
        containers = {c["name"]: c for c in pod["spec"].get("containers", [])}
        restart_policy = pod["spec"].get("restartPolicy", "Always")
        ports = {str(k): v for k, v in instance.port_map.items()}
        await self._patch(
            self._pod_path(pod), {"metadata": {"annotations": {PORT_MAP_ANNOTATION: json.dumps(ports)}}}
        )
        try:
            for name, container in containers.items():
                await self._start_container(name, container, pod, instance)
        except (ValueError, RuntimeError) as exc:
            await self._patch(
                self._pod_path(pod, "/status"),
                {"status": {"phase": "Failed", "reason": "UnsupportedCommand", "message": str(exc)}},
            )
            instance.failed = str(exc)
            return
        last_status: JSON | None = None
        transitions: dict[str, tuple[str, str]] = {}  # condition type -> (status, since)
        while True:
            ready_flags = {}
            for name, container in containers.items():
                child = instance.children[name]
                if not child.running:
                    code = child.process.returncode
                    restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
                    if restart and instance.restarts.get(name, 0) < MAX_RESTARTS:
                        instance.restarts[name] = instance.restarts.get(name, 0) + 1
                        # a crash-loop backs off, as the kubelet's CrashLoopBackOff does (shorter)
                        await asyncio.sleep(min(0.25 * 2 ** instance.restarts[name], 4.0))
                        await self._start_container(name, container, pod, instance)
                        ready_flags[name] = False
                        continue
                    phase = "Succeeded" if code == 0 else "Failed"
                    await self._patch(
                        self._pod_path(pod, "/status"),
                        {
                            "status": {
                                "phase": phase,
                                "reason": "Error" if code else "Completed",
                                "message": f"container {name} exited with {code}",
                                "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed"}],
                            }
                        },
                    )
                    instance.failed = f"{name} exited with {code}"
                    await self._stop_instance(instance)
                    return
                ready_flags[name] = await self._probe(container, instance)
            instance.ready = all(ready_flags.values())
            ready = "True" if instance.ready else "False"
            observed = {
                "PodScheduled": "True",
                "Initialized": "True",
                "ContainersReady": ready,
                "Ready": ready,
            }
            for type_, value in observed.items():
                if transitions.get(type_, ("", ""))[0] != value:
                    transitions[type_] = (value, now_rfc3339())
            status = {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": t, "status": s, "lastTransitionTime": since}
                    for t, (s, since) in transitions.items()
                ],
                "containerStatuses": [
                    {
                        "name": n,
                        "ready": ready_flags[n],
                        "restartCount": instance.restarts.get(n, 0),
                        "image": c.get("image", ""),
                        "imageID": "",
                        "started": True,
                        "state": {"running": {"startedAt": instance.started.get(n, "")}},
                    }
                    for n, c in containers.items()
                ],
            }
            if status != last_status:
                await self._patch(self._pod_path(pod, "/status"), {"status": status})
                last_status = status
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _stop_instance(self, instance: Instance) -> None:
        if instance.task is not None and instance.task is not asyncio.current_task():
            instance.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await instance.task
        children = list(instance.children.values())
        instance.children.clear()
        for child in children:
            if child in self.supervisor.children:
                await self.supervisor.stop(child)

    # -- deployments -----------------------------------------------------------------------------

    async def _on_deployment(self, kind: str, dep: JSON) -> None:
        if kind == "RESYNC":
            return
        meta = dep["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        template = dep.get("spec", {}).get("template", {})
        digest = hashlib.sha256(json.dumps([template, meta.get("uid")], sort_keys=True).encode()).hexdigest()
        replicas = (
            0
            if kind == "DELETED" or meta.get("deletionTimestamp")
            else dep.get("spec", {}).get("replicas", 1)
        )
        instances = self.deployments.setdefault(key, [])
        if self._deployment_hash.get(key) != digest:  # a new template: replace every instance
            for inst in instances:
                await self._stop_instance(inst)
            instances.clear()
            self._deployment_hash[key] = digest
        while len(instances) > replicas:
            await self._stop_instance(instances.pop())
        pod = {
            "metadata": {
                **template.get("metadata", {}),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
            },
            "spec": template.get("spec", {}),
        }
        while len(instances) < replicas:
            inst = Instance(
                f"{key}#{len(instances)}",
                {p: pick_host_port(self.ports) for p in declared_ports(pod["spec"])},
            )
            instances.append(inst)
            inst.task = asyncio.create_task(self._run_deployment_instance(dep, pod, inst))
        if replicas == 0:
            self.deployments.pop(key, None)
            self._deployment_hash.pop(key, None)
        else:
            await self._publish_deployment(dep)

    async def _run_deployment_instance(self, dep: JSON, pod: JSON, instance: Instance) -> None:
        containers = {c["name"]: c for c in pod["spec"].get("containers", [])}
        try:
            for name, container in containers.items():
                await self._start_container(name, container, pod, instance)
        except (ValueError, RuntimeError) as exc:
            instance.failed = str(exc)
            return
        while True:
            ready = True
            for name, container in containers.items():
                child = instance.children[name]
                if not child.running and instance.restarts.get(name, 0) < MAX_RESTARTS:
                    instance.restarts[name] = instance.restarts.get(name, 0) + 1
                    await self._start_container(name, container, pod, instance)
                ready = ready and child.running and await self._probe(container, instance)
            if ready != instance.ready:
                instance.ready = ready
                await self._publish_deployment(dep)
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _publish_deployment(self, dep: JSON) -> None:
        meta = dep["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        instances = self.deployments.get(key, [])
        path = f"/apis/apps/v1/namespaces/{meta.get('namespace')}/deployments/{meta['name']}"
        maps = [{str(k): v for k, v in i.port_map.items()} for i in instances]
        await self._patch(path, {"metadata": {"annotations": {PORT_MAPS_ANNOTATION: json.dumps(maps)}}})
        ready = sum(1 for i in instances if i.ready)
        await self._patch(
            path + "/status",
            {
                "status": {
                    "replicas": len(instances),
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                    "updatedReplicas": len(instances),
                    "observedGeneration": meta.get("generation", 1),
                }
            },
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> None:
        async with self.supervisor, aiohttp.ClientSession() as session:
            self.session = session
            try:
                await asyncio.gather(
                    self._watch("/api/v1/pods", self._on_pod),
                    self._watch("/apis/apps/v1/deployments", self._on_deployment),
                )
            finally:
                for inst in list(self.pods.values()) + [i for lst in self.deployments.values() for i in lst]:
                    if inst.task is not None:
                        inst.task.cancel()
                self.pods.clear()
                self.deployments.clear()


class KubeletThread:
    """Runs a :class:`Kubelet` in its own thread and event loop; ``stop()`` kills every process."""

    def __init__(self, api_url: str, run_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.kubelet = Kubelet(api_url, run_dir, extra_env=extra_env)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-shim", daemon=True)

    def start(self) -> KubeletThread:
        self._thread.start()
        self._started.wait(10)
        return self

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self.kubelet.run()

        asyncio.run(main())

    def stop(self) -> None:
        if self.loop is not None and self._task is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._task.cancel)
            self._thread.join(20)
        self.kubelet.supervisor.kill_remaining()

    def pod_port_map(self, namespace: str, name: str) -> dict[int, int]:
        inst = self.kubelet.pods.get(f"{namespace}/{name}")
        return dict(inst.port_map) if inst else {}
