"""spec.engine.apiKeySecretRef: the engine's API key, from a Secret, to the engine and its sidecar.

Specification:
* set, the sidecar container gets ``PREFIXFLEET_ENGINE_API_KEY`` from the Secret (a secretKeyRef the
  kubelet resolves: the operator never reads the Secret), and the engine is keyed: vLLM by its
  ``VLLM_API_KEY`` variable, SGLang by ``--api-key $(PREFIXFLEET_ENGINE_API_KEY)`` (Kubernetes expands
  ``$(VAR)`` in args from the container's env), so no pod spec holds the key; the emulator checks no
  key, so only its sidecar gets it;
* the sidecar's args, read by its real parser, are those of a fleet without the key (no flag for
  it), and the sidecar built from them and the pod's env sends ``Bearer <key>``;
* unset, no pod changes (same template hash as before the field existed: no rollout on upgrade);
* a bad Secret name or key is refused by the models.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from prefixfleet.cli import build_parser
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, replica_template
from prefixfleet.router.sidecar import ENGINE_API_KEY_ENV, Sidecar, SidecarConfig

KEY = "sk-from-the-secret"
SECRETS = {("engine-key", "token"): KEY, ("redis-pw", "pw"): "redis-secret"}
REF = FleetRef(name="f", namespace="ns")


def spec(kind: str, **engine: Any) -> FleetSpec:
    return FleetSpec.model_validate(
        {"model": {"name": "m", "revision": "r1"}, "engine": {"kind": kind, **engine}}
    )


def containers(fleet: FleetSpec) -> dict[str, dict[str, Any]]:
    template, _ = replica_template(REF, fleet, "redis://redis:6379/0")
    return {c["name"]: c for c in template["spec"]["containers"]}


def kubelet_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: secretKeyRefs read from SECRETS,
    fieldRefs given stand-in values, later entries winning."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = SECRETS[(ref["name"], ref["key"])]
        else:
            env[item["name"]] = f"<{item['name']}>"
    return env


def kubelet_args(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Args with Kubernetes' $(VAR) expansion (an unknown variable stays as written)."""
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a) for a in container["args"]
    ]


KEYED = {"apiKeySecretRef": {"name": "engine-key", "key": "token"}}


@pytest.mark.parametrize("kind", ["vllm", "sglang", "emulator"])
def test_the_sidecar_gets_the_key_from_the_secret_and_sends_it(kind: str) -> None:
    pod = containers(spec(kind, **KEYED))
    sidecar = pod["sidecar"]
    env = kubelet_env(sidecar)
    assert env[ENGINE_API_KEY_ENV] == KEY
    assert KEY not in str(pod)  # the pod spec names the Secret, never holds the key
    args = kubelet_args(sidecar, env)
    parsed = build_parser().parse_args(["router", "sidecar", *args])  # the sidecar's real parser
    assert parsed.engine.startswith("http://127.0.0.1:")
    # the sidecar the pod runs: the key from its environment, as the process reads it
    key = env[ENGINE_API_KEY_ENV]
    config = SidecarConfig(engine_url=parsed.engine, redis_url=None, port=parsed.port, engine_api_key=key)
    assert Sidecar(config).engine_headers == {"Authorization": f"Bearer {KEY}"}
    # unkeyed, the same sidecar args
    assert containers(spec(kind))["sidecar"]["args"] == sidecar["args"]


def test_vllm_reads_its_key_from_vllm_api_key() -> None:
    engine = containers(spec("vllm", **KEYED))["engine"]
    env = kubelet_env(engine)
    assert env["VLLM_API_KEY"] == KEY  # vLLM: token = VLLM_API_KEY or --api-key
    assert "--api-key" not in engine["args"]
    assert containers(spec("vllm"))["engine"]["args"] == engine["args"]


def test_sglang_gets_api_key_expanded_from_its_env() -> None:
    engine = containers(spec("sglang", **KEYED))["engine"]
    env = kubelet_env(engine)
    args = kubelet_args(engine, env)
    assert args[args.index("--api-key") + 1] == KEY
    assert engine["args"][engine["args"].index("--api-key") + 1] == f"$({ENGINE_API_KEY_ENV})"


def test_the_emulator_engine_is_not_keyed_and_still_parses() -> None:
    engine = containers(spec("emulator", **KEYED))["engine"]
    assert engine["args"] == containers(spec("emulator"))["engine"]["args"]
    assert not engine["env"]
    words = [*engine["command"][1:], *engine["args"]]  # prefixfleet emulator ARGS
    assert build_parser("emulator").parse_args(words).port == 30000  # the emulator's real parser


def test_a_spec_env_comes_after_the_key() -> None:
    engine = containers(spec("vllm", env=[{"name": "A", "value": "1"}], **KEYED))["engine"]
    assert [e["name"] for e in engine["env"]] == ["VLLM_API_KEY", "A"]


@pytest.mark.parametrize("kind", ["vllm", "sglang", "emulator"])
def test_unset_changes_no_pod(kind: str) -> None:
    a = replica_template(REF, spec(kind), "redis://redis:6379/0")
    b = replica_template(REF, spec(kind, apiKeySecretRef=None), "redis://redis:6379/0")
    assert a == b
    assert ENGINE_API_KEY_ENV not in str(a[0])


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        ({"name": "Bad_Name", "key": "k"}, "name"),
        ({"name": "s", "key": "a/b"}, "key"),
        ({"name": "s"}, "key"),
    ],
)
def test_a_bad_reference_is_refused(ref: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError, match=f"apiKeySecretRef.{field}|api_key_secret_ref.{field}"):
        spec("vllm", apiKeySecretRef=ref)
