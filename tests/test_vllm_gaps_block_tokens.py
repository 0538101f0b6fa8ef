"""A vLLM fleet's spec.router.blockTokens is the engine's --block-size, or the fleet is refused.

vLLM caches (and reports hits in) whole blocks of ``--block-size`` tokens (16 by default); the
operator gives the sidecar and the gateway ``--block-tokens spec.router.blockTokens``, so with
another block size the replicas' summaries claimed prefixes the engine did not hold (or missed ones
it did), and the sidecar's predictions missed what vLLM reported. It was only documented.

Specification:
* blockTokens left out: it is the engine's block size (the last --block-size in spec.engine.args,
  any spelling vLLM's parser takes; 16 without one; 16 for an engine speaking SGLang's API), also
  after the API server's defaulting (the CRD no longer defaults it to 16), and the sidecar and the
  gateway are given it;
* blockTokens given and not the engine's block size (kind vllm, or the emulator with --api vllm):
  refused by the models (the operator, ``operator validate``) naming both fields, and by the CRD's
  CEL rule for the forms it can read (one --api item, --block-size once); the rule never refuses
  what the models accept;
* a --block-size value that is no whole number is refused naming the arg.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixfleet.cli import build_parser, main
from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import apply_defaults, crd_schema
from prefixfleet.operator.planner import FleetRef, desired_children, replica_template
from tests.test_crd_cel import api_server_refusals, fleet, model_refusal

REF = FleetRef(name="chat", namespace="team-a", uid="uid-1", generation=1)
SCHEMA = crd_schema(build_crd())


def spec_of(engine: dict[str, Any], router: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": "m"}, "engine": engine}
    if router is not None:
        spec["router"] = router
    return spec


def stored(spec: dict[str, Any]) -> models.FleetSpec:
    """The spec as the operator reads it back from the API server (CRD defaults applied)."""
    obj = apply_defaults(SCHEMA, fleet(copy.deepcopy(spec)))
    return models.validate_spec(obj["spec"])


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ({"kind": "vllm"}, 16),
        ({"kind": "vllm", "args": ["--block-size", "32"]}, 32),
        ({"kind": "vllm", "args": ["--block-size=64"]}, 64),
        ({"kind": "vllm", "args": ["--block_size", "8"]}, 8),  # vLLM's parser takes '_' for '-'
        ({"kind": "vllm", "args": ["--block-size", "8", "--block-size=128"]}, 128),  # the last one wins
        ({"kind": "emulator", "args": ["--api", "vllm", "--block-size", "32"]}, 32),
        ({"kind": "emulator", "args": ["--api=vllm"]}, 16),
        ({"kind": "sglang"}, 16),
        ({"kind": "emulator"}, 16),
    ],
)
def test_left_out_it_is_the_engines_block_size_and_the_pods_are_given_it(
    engine: dict[str, Any], expected: int
) -> None:
    fleet_spec = stored(spec_of(engine))
    assert fleet_spec.router.block_tokens == expected
    template, _ = replica_template(REF, fleet_spec, "redis://r:6379/0")
    sidecar = next(c for c in template["spec"]["containers"] if c["name"] == "sidecar")
    assert build_parser().parse_args(["router", "sidecar", *sidecar["args"]]).block_tokens == expected
    gateway = next(
        c
        for child in desired_children(REF, fleet_spec, "redis://r:6379/0")
        if child["kind"] == "Deployment"
        for c in child["spec"]["template"]["spec"]["containers"]
        if c["name"] == "gateway"
    )
    assert gateway["args"][gateway["args"].index("--block-tokens") + 1] == str(expected)


@pytest.mark.parametrize(
    ("engine", "block_tokens", "size"),
    [
        ({"kind": "vllm", "args": ["--block-size", "32"]}, 16, 32),
        ({"kind": "vllm"}, 32, 16),
        ({"kind": "emulator", "args": ["--api", "vllm", "--block-size=64"]}, 16, 64),
    ],
)
def test_given_and_not_the_engines_it_is_refused_naming_both_fields(
    engine: dict[str, Any], block_tokens: int, size: int
) -> None:
    spec = spec_of(engine, {"blockTokens": block_tokens})
    refusal = model_refusal(spec)
    assert refusal is not None
    assert f"spec.router.blockTokens ({block_tokens})" in refusal
    assert f"--block-size in spec.engine.args ({size}" in refusal
    refusals = api_server_refusals(fleet(spec))  # the CRD's CEL rule, as the API server runs it
    assert [rule["fieldPath"] for _path, rule, _self in refusals] == [".router.blockTokens"], refusals


@pytest.mark.parametrize(
    "engine",
    [
        {"kind": "sglang", "args": ["--block-size", "32"]},  # not vLLM's API: blockTokens is free
        {"kind": "emulator", "args": ["--block-size", "32"]},
    ],
)
def test_an_engine_speaking_sglangs_api_takes_any_block_tokens(engine: dict[str, Any]) -> None:
    spec = spec_of(engine, {"blockTokens": 8})
    assert model_refusal(spec) is None and api_server_refusals(fleet(spec)) == []


@pytest.mark.parametrize("value", ["x", "0", "-16", "032", "", "१६"])
def test_a_block_size_that_is_no_whole_number_is_refused_naming_the_arg(value: str) -> None:
    refusal = model_refusal(spec_of({"kind": "vllm", "args": ["--tp", "2", "--block-size", value]}))
    assert refusal is not None and "spec.engine.args[2]: --block-size" in refusal, refusal


def test_operator_validate_refuses_the_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "chat"},
        "spec": spec_of({"kind": "vllm", "args": ["--block-size", "32"]}, {"blockTokens": 16}),
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["operator", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "spec.router.blockTokens" in out and "--block-size" in out, out
    del manifest["spec"]["router"]  # left out: the engine's 32, accepted
    path.write_text(yaml.safe_dump(manifest))
    assert main(["operator", "validate", str(path)]) == 0, capsys.readouterr().out


# the differential property, for specs around this rule's boundaries
API_ARGS = ["--api", "vllm", "sglang", "--api=vllm", "--api=sglang"]
SIZE_ARGS = ["--block-size", "--block_size", "--block-size=16", "--block-size=32", "--block_size=32"]
SIZE_ARGS += ["16", "32"]
args_lists = st.lists(st.sampled_from([*API_ARGS, *SIZE_ARGS, "--tp", "2"]), max_size=6)
specs = st.builds(
    lambda kind, args, block_tokens: spec_of(
        {"kind": kind, "args": args}, None if block_tokens is None else {"blockTokens": block_tokens}
    ),
    st.sampled_from(models.ENGINE_KINDS),
    args_lists,
    st.none() | st.sampled_from([8, 16, 32]),
)


def readable_by_the_rule(args: list[str]) -> bool:
    """The forms the CEL rule reads (see models._cel_block_size_rule): one --api item at most,
    --block-size once at most (any spelling)."""
    api = [a for a in args if a == "--api" or a.startswith("--api=")]
    sizes = [a for a in args if a.split("=", 1)[0] in models.BLOCK_SIZE_FLAGS]
    return len(api) <= 1 and len(sizes) <= 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_the_rule_refuses_what_the_models_refuse_where_it_can_read_the_args(spec: dict[str, Any]) -> None:
    refusals = api_server_refusals(fleet(spec))
    refused_by_model = model_refusal(spec)
    assert not refusals or refused_by_model, f"the CRD refuses what the models accept: {refusals} {spec}"
    args = spec["engine"]["args"]
    # a bare flag's value the models refuse as no number is their own check (no rule reads it)
    values_ok = refused_by_model is None or "is not a whole number" not in refused_by_model
    if readable_by_the_rule(args) and values_ok and "blockTokens" in spec.get("router", {}):
        assert bool(refusals) == bool(refused_by_model), (refusals, refused_by_model, spec)
