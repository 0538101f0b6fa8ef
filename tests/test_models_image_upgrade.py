"""Fleets stored under the 0.1.0 CRD follow the operator's image after an upgrade.

That CRD gave spec.sidecar.image and spec.router.image the schema default
``ghcr.io/prefixfleet/prefixfleet:0.1.0`` (then PROJECT_IMAGE), which the API server wrote into every
fleet it stored. planner.with_project_image swaps in the operator's configured image
(PREFIXFLEET_IMAGE) only for a value equal to the current PROJECT_IMAGE: once a release bumped it,
those fleets kept the old public image (version skew with the operator, an image an air-gapped
cluster may not pull) and the user's registry setting was ignored. Now the two fields have no schema
default and the stored old default is read as unset.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixfleet.operator import models, planner
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import apply_defaults, crd_schema
from prefixfleet.operator.planner import FleetRef, ObservedState, plan_reconcile

ROOT = Path(__file__).resolve().parent.parent
OLD_DEFAULT = "ghcr.io/prefixfleet/prefixfleet:0.1.0"
NEXT_RELEASE = "ghcr.io/prefixfleet/prefixfleet:0.2.0"
MIRROR = "registry.example.com/prefixfleet:0.2.0"
FLEET = FleetRef(name="emulator-fleet", namespace="default", uid="uid-1")


@pytest.fixture
def next_release(monkeypatch: pytest.MonkeyPatch) -> None:
    # The next release bumps PROJECT_IMAGE; models fills defaults from it, planner swaps by it.
    monkeypatch.setattr(models, "PROJECT_IMAGE", NEXT_RELEASE)
    monkeypatch.setattr(planner, "PROJECT_IMAGE", NEXT_RELEASE)


def example() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "emulator-fleet.yaml").read_text())


def stored_under_the_0_1_0_crd() -> dict[str, Any]:
    """The example as the API server stored it under the 0.1.0 CRD: its defaults written in."""
    fleet = example()
    fleet["spec"].setdefault("sidecar", {})["image"] = OLD_DEFAULT
    fleet["spec"].setdefault("router", {})["image"] = OLD_DEFAULT
    return fleet


def planned_images(fleet: dict[str, Any], operator_image: str) -> dict[str, set[str]]:
    """Image of every engine, sidecar and gateway container the operator plans for ``fleet``."""
    spec = models.PrefixCacheFleet.model_validate(fleet).spec
    plan = plan_reconcile(
        FLEET,
        spec,
        ObservedState(redis_url="redis://r:6379/0", project_image=operator_image),
    )
    images: dict[str, set[str]] = {"engine": set(), "sidecar": set(), "gateway": set()}
    assert plan.create_pods, "the fleet's replica pods should be planned"
    for pod in plan.create_pods:
        for container in pod["spec"]["containers"]:
            images[container["name"]].add(container["image"])
    deployments = [c.manifest for c in plan.children if c.manifest["kind"] == "Deployment"]
    assert deployments, "the fleet's gateway Deployment should be planned"
    for deployment in deployments:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            images[container["name"]].add(container["image"])
    return images


def test_a_fleet_stored_with_the_old_default_gets_the_operators_image(next_release: None) -> None:
    images = planned_images(stored_under_the_0_1_0_crd(), MIRROR)
    assert images == {"engine": {MIRROR}, "sidecar": {MIRROR}, "gateway": {MIRROR}}


def test_the_old_default_is_read_as_unset_without_an_operator_image(next_release: None) -> None:
    spec = models.PrefixCacheFleet.model_validate(stored_under_the_0_1_0_crd()).spec
    assert spec.sidecar.image == spec.router.image == spec.engine.image == NEXT_RELEASE
    images = planned_images(stored_under_the_0_1_0_crd(), "")
    assert images == {"engine": {NEXT_RELEASE}, "sidecar": {NEXT_RELEASE}, "gateway": {NEXT_RELEASE}}


def test_an_explicit_other_image_stays_as_written(next_release: None) -> None:
    fleet = stored_under_the_0_1_0_crd()
    fleet["spec"]["sidecar"]["image"] = "mirror.example/sidecar:pinned"
    fleet["spec"]["router"]["image"] = "mirror.example/gateway:pinned"
    images = planned_images(fleet, MIRROR)
    assert images == {
        "engine": {MIRROR},
        "sidecar": {"mirror.example/sidecar:pinned"},
        "gateway": {"mirror.example/gateway:pinned"},
    }


def test_the_next_releases_image_written_explicitly_is_kept(next_release: None) -> None:
    # Only images a CRD once wrote as its default are read as unset, not whatever PROJECT_IMAGE is.
    fleet = stored_under_the_0_1_0_crd()
    fleet["spec"]["router"]["image"] = "ghcr.io/prefixfleet/prefixfleet:0.3.0"
    assert planned_images(fleet, MIRROR)["gateway"] == {"ghcr.io/prefixfleet/prefixfleet:0.3.0"}


def test_the_remembered_default_does_not_follow_project_image(next_release: None) -> None:
    assert models.CRD_0_1_0_DEFAULT_IMAGE == OLD_DEFAULT
    assert OLD_DEFAULT in models.FORMER_CRD_DEFAULT_IMAGES


def test_the_crd_has_no_default_for_the_two_images() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in ("sidecar", "router"):
        node = spec["properties"][part]
        assert "default" not in node["properties"]["image"], part
        # The whole-object default (spec.sidecar left out) must not write the image either.
        assert "image" not in node.get("default", {}), part
        assert "operator's image" in node["properties"]["image"]["description"], part


def test_the_api_server_stores_no_image_for_a_new_fleet() -> None:
    # What `kubectl apply` of the example stores under the generated CRD: the images stay unset.
    for crd_path in ("crds", "charts/prefixfleet/crds"):
        crd = yaml.safe_load((ROOT / crd_path / "prefixcachefleets.prefixfleet.io.yaml").read_text())
        stored = apply_defaults(crd_schema(crd), copy.deepcopy(example()))
        assert "image" not in stored["spec"]["sidecar"], crd_path
        assert "image" not in stored["spec"]["router"], crd_path
