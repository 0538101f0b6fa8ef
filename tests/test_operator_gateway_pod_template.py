"""spec.router.podTemplate: the gateway Deployment's pods take pull secrets, a ServiceAccount,
placement and metadata from the fleet, merged as spec.engine.podTemplate is into replica pods
(planner._merge_template) and refused under the same rules, naming spec.router.podTemplate."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import admission_errors
from prefixfleet.operator.planner import (
    ANNOTATION_SPEC_HASH,
    LABEL_FLEET,
    LABEL_ROLE,
    FleetRef,
    desired_children,
    replica_template,
)
from tests.test_crd_cel import fleet

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1")
REDIS = "redis://r:6379/0"

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "ml"}, "annotations": {"example.com/owner": "ml-infra"}},
    "spec": {
        "imagePullSecrets": [{"name": "ghcr"}],
        "serviceAccountName": "chat-gateway",
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gw", "effect": "NoSchedule"}],
        "priorityClassName": "serving",
        "containers": [
            {"name": "gateway", "workingDir": "/tmp"},
            {"name": "log-shipper", "image": "busybox:1.36", "args": ["sleep", "infinity"]},
        ],
        "volumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}],
    },
}


def fleet_spec(router: dict[str, Any] | None = None, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": {"name": "m"},
        "engine": {"kind": "emulator", **(engine or {})},
        "router": router or {},
    }


def deployment(spec: dict[str, Any]) -> dict[str, Any]:
    children = desired_children(FLEET, models.validate_spec(spec), REDIS)
    (found,) = [c for c in children if c["kind"] == "Deployment"]
    return found


def test_the_gateway_pod_template_is_merged_into_the_deployments_pods() -> None:
    plain = deployment(fleet_spec())["spec"]["template"]
    merged = deployment(fleet_spec({"podTemplate": TEMPLATE}))["spec"]["template"]
    pod = merged["spec"]
    for key in ("imagePullSecrets", "serviceAccountName", "nodeSelector", "tolerations", "priorityClassName"):
        assert pod[key] == TEMPLATE["spec"][key], key
    # the operator's labels (the Deployment selects by them) and its spec-hash annotation stay
    assert merged["metadata"]["labels"] == {**plain["metadata"]["labels"], "team": "ml"}
    assert merged["metadata"]["annotations"] == {
        **plain["metadata"]["annotations"],
        "example.com/owner": "ml-infra",
    }
    # containers merge by name: the gateway keeps what the operator generated, the added one follows
    assert [c["name"] for c in pod["containers"]] == ["gateway", "log-shipper"]
    (generated,) = plain["spec"]["containers"]
    assert pod["containers"][0] == {**generated, "workingDir": "/tmp"}
    # volumes merge by name too: the settings volume the gateway mounts stays
    assert pod["volumes"] == [*plain["spec"]["volumes"], {"name": "ca", "configMap": {"name": "ca-bundle"}}]
    # everything else the operator generated is untouched
    assert {k: v for k, v in pod.items() if k not in TEMPLATE["spec"]} == {
        k: v for k, v in plain["spec"].items() if k not in TEMPLATE["spec"]
    }


def test_the_merged_deployment_is_a_valid_kubernetes_object_whose_selector_matches() -> None:
    manifest = deployment(fleet_spec({"podTemplate": TEMPLATE}))
    kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    selector = manifest["spec"]["selector"]["matchLabels"]
    assert set(selector) == {LABEL_FLEET, LABEL_ROLE}
    assert selector.items() <= manifest["spec"]["template"]["metadata"]["labels"].items()


def test_a_gateway_pod_template_change_changes_the_deployments_hash_only() -> None:
    before = {c["kind"]: c for c in desired_children(FLEET, models.validate_spec(fleet_spec()), REDIS)}
    changed = fleet_spec({"podTemplate": {"spec": {"nodeSelector": {"pool": "cpu"}}}})
    after = {c["kind"]: c for c in desired_children(FLEET, models.validate_spec(changed), REDIS)}

    def spec_hash(kind: str, children: dict[str, Any]) -> str:
        return children[kind]["metadata"]["annotations"][ANNOTATION_SPEC_HASH]

    assert spec_hash("Deployment", after) != spec_hash("Deployment", before)
    assert spec_hash("ConfigMap", after) == spec_hash("ConfigMap", before)
    assert spec_hash("Service", after) == spec_hash("Service", before)


def test_each_pod_template_reaches_only_its_own_pods() -> None:
    spec = models.validate_spec(
        fleet_spec(
            {"podTemplate": {"spec": {"nodeSelector": {"pool": "cpu"}}}},
            {"podTemplate": {"spec": {"nodeSelector": {"pool": "gpu"}}}},
        )
    )
    (gateway,) = [c for c in desired_children(FLEET, spec, REDIS) if c["kind"] == "Deployment"]
    replica, _ = replica_template(FLEET, spec, REDIS)
    assert gateway["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert replica["spec"]["nodeSelector"] == {"pool": "gpu"}


def test_merging_leaves_the_spec_as_it_was() -> None:
    spec = models.validate_spec(fleet_spec({"podTemplate": TEMPLATE}))
    first = desired_children(FLEET, spec, REDIS)
    assert spec.router.pod_template == TEMPLATE
    assert desired_children(FLEET, spec, REDIS) == first


# Each refusal of spec.engine.podTemplate, for the gateway: the models and the CRD both refuse it,
# naming spec.router.podTemplate.
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "a Pod field beside spec": ({"nodeSelector": {"pool": "cpu"}}, "spec.router.podTemplate.nodeSelector"),
    "the operator's role label": (
        {"metadata": {"labels": {"prefixfleet.io/role": "x"}}},
        "spec.router.podTemplate.metadata.labels",
    ),
    "the operator's component label": (
        {"metadata": {"labels": {"app.kubernetes.io/component": "x"}}},
        "spec.router.podTemplate.metadata.labels",
    ),
    "the operator's spec-hash annotation": (
        {"metadata": {"annotations": {"prefixfleet.io/spec-hash": "x"}}},
        "spec.router.podTemplate.metadata.annotations",
    ),
    "an added container without an image": (
        {"spec": {"containers": [{"name": "log-shipper"}]}},
        "spec.router.podTemplate.spec.containers",
    ),
    "the engine's container (not the gateway's) without an image": (
        {"spec": {"containers": [{"name": "engine"}]}},
        "spec.router.podTemplate.spec.containers",
    ),
    "the gateway container twice": (
        {"spec": {"containers": [{"name": "gateway"}, {"name": "gateway"}]}},
        "spec.router.podTemplate.spec.containers",
    ),
    "an init container without an image": (
        {"spec": {"initContainers": [{"name": "fetch"}]}},
        "spec.router.podTemplate.spec.initContainers",
    ),
    "a volume without a name": (
        {"spec": {"volumes": [{"emptyDir": {}}]}},
        "spec.router.podTemplate.spec.volumes",
    ),
    "one volume twice": (
        {"spec": {"volumes": [{"name": "ca", "emptyDir": {}}, {"name": "ca", "emptyDir": {}}]}},
        "spec.router.podTemplate.spec.volumes",
    ),
}


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.mark.parametrize(("template", "field"), REFUSED.values(), ids=REFUSED.keys())
def test_the_models_and_the_crd_refuse_what_the_engine_template_refuses(
    template: dict[str, Any], field: str, crd: dict[str, Any]
) -> None:
    spec = fleet_spec({"podTemplate": template})
    with pytest.raises(models.InvalidFleetSpec) as err:
        models.validate_spec(copy.deepcopy(spec))
    assert any(p.startswith(field) for p in err.value.problems), err.value.problems
    problems = admission_errors(crd, fleet(spec))
    assert any(field in p for p in problems), problems


def test_the_crd_and_the_models_take_a_template_that_merges_cleanly(crd: dict[str, Any]) -> None:
    spec = fleet_spec({"podTemplate": TEMPLATE})
    assert admission_errors(crd, fleet(spec)) == []
    assert models.validate_spec(spec).router.pod_template == TEMPLATE
