"""The replica pod the operator plans for each engine kind, vLLM's in particular.

Specification:
* the sidecar is told which API its engine speaks: ``--engine-api vllm`` for a vLLM fleet,
  ``--engine-api sglang`` for SGLang and the emulator (which speaks SGLang's API). The generated
  args are parsed by the real ``prefixfleet router sidecar`` parser, so the planner and the CLI
  cannot drift apart;
* a vLLM engine runs ``vllm serve MODEL`` on 127.0.0.1 at spec.engine.port (8000 by default), with
  ``--enable-prompt-tokens-details``, and the sidecar reaches it there; the pod's only probe is the
  sidecar's readiness probe of GET /health (proxied to vLLM's /health) on the sidecar's port;
* VLLM_SERVER_DEV_MODE is not set by the operator (its dev routes would be reachable through the
  sidecar, which forwards every path: see the comment in operator/planner.py); a spec's own
  spec.engine.env may set it, and the engine container then has it once;
* a LoRA adapter reaches vLLM in a form its ``--lora-modules`` parser accepts (name=path or a JSON
  object; a bare name is refused), named as the sidecar's ``--adapter`` cache identity.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from prefixfleet.cli import build_parser
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, replica_template

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1", generation=1)
REDIS = "redis://r:6379/0"


def containers(kind: str, **spec: Any) -> dict[str, dict[str, Any]]:
    model = spec.pop("model", {"name": "Qwen/Qwen2.5-7B-Instruct"})
    engine = {"kind": kind, **spec}
    fleet = FleetSpec.model_validate({"model": model, "engine": engine, "replicas": 1})
    template, _ = replica_template(FLEET, fleet, REDIS)
    return {c["name"]: c for c in template["spec"]["containers"]}


def parsed_sidecar(container: dict[str, Any]) -> argparse.Namespace:
    """The sidecar container's command line as `prefixfleet` parses it (exits on a refused flag)."""
    assert container["command"] == ["prefixfleet", "router", "sidecar"]
    return build_parser().parse_args([*container["command"][1:], *container["args"]])


@pytest.mark.parametrize(("kind", "api"), [("vllm", "vllm"), ("sglang", "sglang"), ("emulator", "sglang")])
def test_the_sidecar_is_told_the_api_its_engine_speaks(kind: str, api: str) -> None:
    sidecar = containers(kind)["sidecar"]
    assert sidecar["args"].count("--engine-api") == 1
    assert parsed_sidecar(sidecar).engine_api == api


def test_a_vllm_engine_serves_on_loopback_where_the_sidecar_and_its_probe_reach_it() -> None:
    pod = containers("vllm")
    engine, sidecar = pod["engine"], pod["sidecar"]
    assert engine["image"] == "vllm/vllm-openai:latest"
    # `command` replaces the image's ENTRYPOINT (["vllm", "serve"]): the subcommand is not repeated
    assert engine["command"] == ["vllm", "serve"]
    args = engine["args"]
    assert args[0] == "Qwen/Qwen2.5-7B-Instruct"
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "8000"
    assert args.count("--enable-prompt-tokens-details") == 1
    assert "readinessProbe" not in engine and "livenessProbe" not in engine  # loopback: the kubelet can't
    parsed = parsed_sidecar(sidecar)
    assert parsed.engine == "http://127.0.0.1:8000"
    probe = sidecar["readinessProbe"]["httpGet"]
    assert probe == {"path": "/health", "port": "http"}
    assert sidecar["ports"] == [{"name": "http", "containerPort": parsed.port}]


def test_dev_mode_is_left_to_the_spec() -> None:
    assert "VLLM_SERVER_DEV_MODE" not in {e["name"] for e in containers("vllm")["engine"]["env"]}
    opted_in = containers("vllm", env=[{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}])["engine"]
    assert [e for e in opted_in["env"] if e["name"] == "VLLM_SERVER_DEV_MODE"] == [
        {"name": "VLLM_SERVER_DEV_MODE", "value": "1"}
    ]


def vllm_lora_modules(item: str) -> tuple[str, str]:
    """(name, path) as vLLM's LoRAParserAction reads one --lora-modules item (vllm-project/vllm,
    vllm/entrypoints/openai/cli_args.py): ``name=path`` when it has '=' and no ',', else a JSON
    object with name and path; anything else is a parser error (here ValueError)."""
    if "=" in item and "," not in item:
        name, path = item.split("=")
        return name, path
    lora = json.loads(item)
    if not isinstance(lora, dict):
        raise ValueError(f"Invalid fields for --lora-modules: {item}")
    return lora["name"], lora["path"]


@pytest.mark.parametrize("adapter", ["acme/support-lora", "/models/lora,v2", "team=a"])
def test_a_vllm_lora_adapter_is_given_in_a_form_vllm_accepts(adapter: str) -> None:
    pod = containers("vllm", model={"name": "m", "adapter": adapter})
    args = pod["engine"]["args"]
    assert "--enable-lora" in args
    assert vllm_lora_modules(args[args.index("--lora-modules") + 1]) == (adapter, adapter)
    assert parsed_sidecar(pod["sidecar"]).adapter == adapter  # the name requests use, the cache identity
