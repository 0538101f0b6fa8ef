"""Everything the operator creates is a valid Kubernetes object (strict schema of Kubernetes 1.37)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedState, plan_reconcile

FLEET = FleetRef(name="chat", namespace="team-a", uid="0b9e7a2c-1111-4222-8333-444455556666")

SPECS = {
    "emulator": {"model": {"name": "m"}, "engine": {"kind": "emulator", "args": ["--time-scale", "10"]}},
    "sglang-gpu": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "revision": "abc", "adapter": "lora-a"},
        "engine": {"kind": "sglang", "resources": {"limits": {"nvidia.com/gpu": 1}},
                   "env": [{"name": "HF_TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                   "podTemplate": {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}}},
        "redis": {"secretRef": {"name": "redis", "key": "url"}},
        "router": {"replicas": 2, "policy": "sglang_cache_aware", "policyParams": {"cache_threshold": 0.3}},
    },
    "vllm": {"model": {"name": "Qwen/Qwen2.5-7B"}, "engine": {"kind": "vllm"}, "replicas": 3},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_child_passes_the_kubernetes_schema(name: str) -> None:
    spec = FleetSpec.model_validate(SPECS[name])
    plan = plan_reconcile(FLEET, spec, ObservedState(redis_url="redis://redis:6379/0"))
    manifests = [*plan.create_pods, *(c.manifest for c in plan.children)]
    assert {m["kind"] for m in manifests} == {"Pod", "ConfigMap", "Deployment", "Service"}
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.37.0", strict=True)
