"""The example fleets, end to end on paper: each is a valid PrefixCacheFleet, the operator's planner
turns it into valid Kubernetes objects, and every `prefixfleet` command those objects run exists."""

from __future__ import annotations

import argparse
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fleet_fixtures import Spawner, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.cli import build_parser
from prefixfleet.operator import planner
from prefixfleet.operator.models import PrefixCacheFleet

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSION = "1.33.0"


def children(path: Path) -> list[dict[str, Any]]:
    fleet = PrefixCacheFleet.model_validate(yaml.safe_load(path.read_text()))
    ref = planner.FleetRef(name=fleet.metadata["name"], namespace="default", uid="0f3c-uid")
    redis_url = "redis://prefixfleet-redis.prefixfleet.svc:6379/0"
    template, template_hash = planner.replica_template(ref, fleet.spec, redis_url)
    return [
        planner.replica_pod(ref, template, template_hash, 0),
        *planner.desired_children(ref, fleet.spec, redis_url),
    ]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj.get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_planned_children_of_each_example_are_valid_kubernetes(path: Path) -> None:
    objects = children(path)
    assert {o["kind"] for o in objects} >= {"Pod", "Deployment", "Service", "ConfigMap"}
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.path}: {exc.message}")


def _subcommand(parser: argparse.ArgumentParser, words: list[str]) -> bool:
    for word in words:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or word not in actions[0].choices:
            return False
        parser = actions[0].choices[word]
    return True


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_prefixfleet_command_the_planned_pods_run_exists_and_parses(path: Path) -> None:
    parser = build_parser()
    commands = [c["command"] + c.get("args", []) for o in children(path) for c in containers(o)]
    ours = [argv[1:] for argv in commands if argv and argv[0] == "prefixfleet"]
    assert ours, "every fleet runs at least the sidecar and the gateway"
    for argv in ours:
        words = argv[:1] if argv[0] == "emulator" else argv[:2]
        assert _subcommand(parser, words), f"`prefixfleet {' '.join(words)}` is not a CLI command"
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"`prefixfleet {' '.join(argv)}` is refused by the CLI (exit {exc.code})")


def _listen_host(container: dict[str, Any]) -> str:
    argv = container.get("command", []) + container.get("args", [])
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--host"), "0.0.0.0")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_readiness_probe_targets_a_port_served_on_the_pod_ip(path: Path) -> None:
    # The kubelet probes podIP:port, so a probed port must not be bound to loopback only.
    for obj in children(path):
        for container in containers(obj):
            probe = (container.get("readinessProbe") or {}).get("httpGet")
            if probe is None:
                continue
            (owner,) = [
                c
                for c in containers(obj)
                for p in c.get("ports", [])
                if probe["port"] in (p["name"], p["containerPort"])
            ]
            where = f"{obj['kind']}/{obj['metadata']['name']}: {container['name']}'s probe of {probe['port']}"
            assert _listen_host(owner) not in ("127.0.0.1", "localhost", "::1"), where


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_volume_of_a_planned_pod_is_mounted(path: Path) -> None:
    for obj in children(path):
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj.get("spec", {})
        mounted = {m["name"] for c in containers(obj) for m in c.get("volumeMounts", [])}
        for volume in spec.get("volumes", []):
            assert volume["name"] in mounted, (
                f"{obj['kind']}/{obj['metadata']['name']}: {volume['name']} unused"
            )


CREATE_SECRET = re.compile(r"kubectl create secret generic (\S+)((?: --from-literal=[^=\s]+=\S*)+)")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_secret_key_the_pods_read_is_created_by_the_examples_instructions(path: Path) -> None:
    created = {
        (name, literal.split("=", 1)[0])
        for name, literals in CREATE_SECRET.findall(path.read_text())
        for literal in literals.split(" --from-literal=")[1:]
    }
    for obj in children(path):
        for container in containers(obj):
            for env in container.get("env", []):
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    assert (ref["name"], ref["key"]) in created, (
                        f"{path.name}: no `kubectl create secret` for {ref}"
                    )


def _restricted_violations(obj: dict[str, Any]) -> list[str]:
    """The restricted Pod Security Standard's container rules (pod-level settings count too)."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    pod = spec.get("securityContext") or {}
    out = []
    for c in containers(obj):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            out.append(f"{c['name']}: capabilities must drop ALL")
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot must be true")
        seccomp = (sc.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile must be RuntimeDefault or Localhost")
    return out


def test_the_emulator_fleets_pods_meet_the_restricted_pod_security_standard() -> None:
    # Namespaces that enforce `restricted` refuse any pod that does not: the CPU-only fleet must run there.
    for obj in children(ROOT / "examples" / "emulator-fleet.yaml"):
        if obj["kind"] in ("Pod", "Deployment"):
            assert _restricted_violations(obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_gateway_pods_meet_the_restricted_pod_security_standard(path: Path) -> None:
    (gateway,) = [o for o in children(path) if o["kind"] == "Deployment"]
    assert _restricted_violations(gateway) == []


def _probe_status(url: str) -> int:
    try:
        # a bound, not the probe's own 3 s: a slow answer on a loaded machine is not a failed probe
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_replica_is_ready_only_while_its_engine_serves(spawn: Spawner) -> None:
    # The engine container has no probe of its own (it listens on loopback): the sidecar's readiness
    # probe must fail while the engine is down, pass once it serves, and fail again when it dies.
    (pod,) = [o for o in children(ROOT / "examples" / "emulator-fleet.yaml") if o["kind"] == "Pod"]
    engine, sidecar = ({c["name"]: c for c in pod["spec"]["containers"]}[n] for n in ("engine", "sidecar"))
    path = sidecar["readinessProbe"]["httpGet"]["path"]
    engine_port, sidecar_port = free_port(), free_port()
    args = engine["args"]
    args = [*args[: args.index("--port") + 1], str(engine_port), *args[args.index("--port") + 2 :]]
    probe = f"http://127.0.0.1:{sidecar_port}{path}"
    spawn(
        prefixfleet_argv("router", "sidecar", "--engine", f"http://127.0.0.1:{engine_port}",
                         "--port", str(sidecar_port), "--worker-id", "r0"),
        name="sidecar", ready_port=sidecar_port,
    )  # fmt: skip
    assert not 200 <= _probe_status(probe) < 400, "ready before its engine started"
    engine_proc = spawn(
        prefixfleet_argv(*engine["command"][1:], *args), name="engine", ready_port=engine_port
    )
    wait_for_http(probe, proc=engine_proc.proc)
    engine_proc.kill()
    assert not 200 <= _probe_status(probe) < 400, "still ready after its engine died"
