"""PrefixCacheFleet models: defaults, wire format, cache identity and refusals."""

from __future__ import annotations

import pytest

from prefixfleet.operator import models
from prefixfleet.operator.models import FleetSpec, InvalidFleetSpec, validate_spec

MINIMAL = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"kind": "sglang"}}


def test_a_minimal_spec_gets_every_default() -> None:
    spec = validate_spec(MINIMAL)
    assert spec.replicas == 1
    assert spec.model.revision == "main"
    assert spec.router.policy == models.DEFAULT_ROUTING_POLICY == "queue_aware"
    assert spec.router.image == spec.sidecar.image == models.PROJECT_IMAGE
    assert spec.autoscaling.enabled is False
    assert spec.prewarm.enabled is True
    assert spec.cache_identity.admission.admit_after_seen_count == 2


@pytest.mark.parametrize(
    ("kind", "image", "port"),
    [
        ("sglang", "lmsysorg/sglang:latest", 30000),
        ("vllm", "vllm/vllm-openai:latest", 8000),
        ("emulator", models.PROJECT_IMAGE, 30000),
    ],
)
def test_engine_image_and_port_default_per_kind(kind: str, image: str, port: int) -> None:
    spec = validate_spec({**MINIMAL, "engine": {"kind": kind}})
    assert (spec.engine.image, spec.engine.port) == (image, port)
    assert models.default_images()[kind] == image
    assert models.default_images()["prefixfleet"] == "ghcr.io/prefixfleet/prefixfleet:0.1.0"


def test_explicit_engine_image_and_port_win() -> None:
    spec = validate_spec({**MINIMAL, "engine": {"kind": "sglang", "image": "my/sglang:1", "port": 9000}})
    assert (spec.engine.image, spec.engine.port) == ("my/sglang:1", 9000)


def test_wire_format_is_camel_case_without_nulls_and_round_trips() -> None:
    spec = validate_spec({**MINIMAL, "autoscaling": {"enabled": True, "targetTTFTSeconds": 0.5}})
    wire = spec.to_wire()
    assert wire["autoscaling"]["targetTTFTSeconds"] == 0.5
    assert "minReplicas" in wire["autoscaling"] and "cacheIdentity" in wire
    assert "adapter" not in wire["model"]  # None is absent, not null
    assert FleetSpec.model_validate(wire) == spec


def test_python_names_are_accepted_too() -> None:
    spec = FleetSpec(model=models.ModelSpec(name="m"), engine=models.EngineSpec(kind="vllm"), replicas=3)
    assert spec.to_wire()["replicas"] == 3


def test_cache_identity_changes_with_every_part_of_it() -> None:
    base = models.ModelSpec(name="m")
    variants = [
        base.model_copy(update={"revision": "r2"}),
        base.model_copy(update={"adapter": "lora-a"}),
        base.model_copy(update={"position_encoding": "rope"}),
        base.model_copy(update={"rope_scaling": '{"type": "yarn", "factor": 4}'}),
    ]
    identities = {base.identity(), *(v.identity() for v in variants)}
    assert len(identities) == 5


def test_policy_params_are_checked_against_the_policy() -> None:
    ok = validate_spec(
        {**MINIMAL, "router": {"policy": "sglang_cache_aware", "policyParams": {"cache_threshold": 0.5}}}
    )
    assert ok.router.policy_params == {"cache_threshold": 0.5}
    with pytest.raises(
        InvalidFleetSpec, match=r"spec\.router\.policyParams\.cacheThreshold: unknown parameter"
    ):
        validate_spec(
            {**MINIMAL, "router": {"policy": "sglang_cache_aware", "policyParams": {"cacheThreshold": 1}}}
        )
    with pytest.raises(InvalidFleetSpec, match=r"spec\.router\.policyParams: cache_threshold must be within"):
        validate_spec(
            {**MINIMAL, "router": {"policy": "sglang_cache_aware", "policyParams": {"cache_threshold": 3}}}
        )


def test_autoscaling_bounds_allow_zero_minimum_and_equal_bounds() -> None:
    validate_spec(
        {**MINIMAL, "replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}
    )
    validate_spec(
        {**MINIMAL, "replicas": 3, "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 3}}
    )


def test_replicas_outside_bounds_are_fine_while_autoscaling_is_off() -> None:
    assert validate_spec({**MINIMAL, "replicas": 10, "autoscaling": {"maxReplicas": 4}}).replicas == 10


def test_env_var_takes_value_or_value_from_not_both() -> None:
    with pytest.raises(InvalidFleetSpec, match="either value or valueFrom"):
        validate_spec(
            {**MINIMAL, "engine": {"kind": "vllm", "env": [{"name": "A", "value": "1", "valueFrom": {}}]}}
        )


def test_several_problems_are_all_reported() -> None:
    with pytest.raises(InvalidFleetSpec) as err:
        validate_spec({"engine": {"kind": "tgi"}, "replicas": -2})
    assert {p.split(":")[0] for p in err.value.problems} == {
        "spec.model",
        "spec.engine.kind",
        "spec.replicas",
    }


def test_status_conditions_are_typed() -> None:
    status = models.FleetStatus.model_validate(
        {
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "PodsFailing",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    )
    assert status.condition("Degraded").status == "True"
    assert status.condition("Ready") is None
    with pytest.raises(ValueError, match="type"):
        models.FleetStatus.model_validate(
            {
                "conditions": [
                    {
                        "type": "Happy",
                        "status": "True",
                        "reason": "X",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        )
