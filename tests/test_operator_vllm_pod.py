"""The replica pod the operator plans for each engine kind, vLLM's in particular.

Specification:
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
