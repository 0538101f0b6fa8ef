"""An operator fleet of emulators in vLLM mode (``engine.kind: emulator``, ``args: [--api, vllm]``).

The way to try a vLLM fleet on a cluster without GPUs. The planner gave every emulator SGLang's
``--enable-cache-report``, which the emulator's vLLM face refuses ("--enable-cache-report is SGLang's
flag; with --api vllm use --enable-prompt-tokens-details", exit 2): every replica crash-looped, and a
spec that also gave ``--enable-prompt-tokens-details`` got both flags and crash-looped the same. The
sidecar was told ``--engine-api sglang`` as well, so it would have asked a vLLM face for SGLang's
routes (404s: no pre-warm, no flush, no capacity).

Now the emulator's ``--api`` decides: the vLLM face gets vLLM's ``--enable-prompt-tokens-details``
(once) and its sidecar ``--engine-api vllm``; the SGLang face is planned as before. The rendered
command lines are parsed by the real ``prefixfleet`` parsers.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixfleet.cli import build_parser
from prefixfleet.emulator.cli import config_from_args, vllm_options_from_args
from prefixfleet.emulator.vllm_api import VllmOptions
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, emulator_api, replica_template

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1", generation=1)


def containers(args: list[str]) -> dict[str, dict[str, Any]]:
    engine = {"kind": "emulator", "args": args}
    fleet = FleetSpec.model_validate({"model": {"name": "m"}, "engine": engine, "replicas": 1})
    template, _ = replica_template(FLEET, fleet, "redis://r:6379/0")
    return {c["name"]: c for c in template["spec"]["containers"]}


def emulator_face(container: dict[str, Any]) -> VllmOptions | None:
    """What `prefixfleet emulator` makes of the engine container's command line (raises UsageError
    for flags the face refuses, as the process would exit 2)."""
    assert container["command"] == ["prefixfleet", "emulator"]
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    return vllm_options_from_args(args, config_from_args(args), {})


def sidecar_api(container: dict[str, Any]) -> str:
    return build_parser().parse_args(["router", "sidecar", *container["args"]]).engine_api


@pytest.mark.parametrize(
    "args",
    [
        ["--api", "vllm"],
        ["--api=vllm"],
        ["--api", "vllm", "--enable-prompt-tokens-details", "--block-size", "32"],
    ],
)
def test_a_vllm_mode_emulator_starts_with_vllms_flag_and_its_sidecar_speaks_vllm(args: list[str]) -> None:
    pod = containers(args)
    face = emulator_face(pod["engine"])
    assert face is not None and face.enable_prompt_tokens_details
    assert pod["engine"]["args"].count("--enable-prompt-tokens-details") == 1
    assert "--enable-cache-report" not in pod["engine"]["args"]
    assert sidecar_api(pod["sidecar"]) == "vllm"


@pytest.mark.parametrize("args", [[], ["--api", "sglang"], ["--api", "vllm", "--api", "sglang"]])
def test_an_sglang_mode_emulator_is_planned_as_before(args: list[str]) -> None:
    pod = containers(args)
    assert emulator_face(pod["engine"]) is None
    assert pod["engine"]["args"].count("--enable-cache-report") == 1
    assert sidecar_api(pod["sidecar"]) == "sglang"


def test_the_api_is_read_as_argparse_reads_it() -> None:
    assert emulator_api([]) == "sglang"
    assert emulator_api(["--api", "vllm"]) == "vllm"
    assert emulator_api(["--api=vllm", "--port", "1"]) == "vllm"
    assert emulator_api(["--api", "vllm", "--api=sglang"]) == "sglang"  # the last one given wins
