"""A child of a fleet converges to the desired manifest: what a spec change drops is removed from it.

The operator updates children with a JSON merge patch, which removes only keys it sets to null. Each
child records what the operator last wrote (``prefixfleet.io/last-applied``), and an update sends
null for what was written then and is not wanted now (operator/last_applied.py), as ``kubectl
apply`` does. Before, a nodeSelector taken out of spec.router.podTemplate stayed on the gateway
Deployment until it was deleted by hand.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.operator import models
from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.last_applied import (
    ANNOTATION_LAST_APPLIED,
    child_patch,
    owned_fields,
    parse_last_applied,
    three_way_patch,
    with_last_applied,
)
from prefixfleet.operator.planner import ANNOTATION_SPEC_HASH, FleetRef, desired_children
from tests.k8s.apiserver import merge_patch
from tests.k8s.cluster import EmulatedCluster

JSON = dict[str, Any]

# ------------------------------------------------------------------ the decision, over plain dicts

# few keys, so that the record, the desired object and others' keys overlap often
KEYS = st.sampled_from(["a", "b", "c", "d"])
LEAVES = st.one_of(
    st.integers(-3, 3), st.sampled_from(["x", "y", ""]), st.lists(st.integers(0, 2), max_size=2)
)
# JSON objects without null (null in a merge patch means "remove"; no manifest holds one)
OBJECTS = st.recursive(
    st.dictionaries(KEYS, LEAVES, max_size=3),
    lambda inner: st.dictionaries(KEYS, st.one_of(LEAVES, inner), max_size=3),
    max_leaves=12,
)


def surviving(foreign: JSON, last: JSON, desired: JSON) -> JSON:
    """What of others' keys a converged object keeps: every key the operator never wrote, and inside
    an object it wrote and still wants as an object, the same again. Under a key it wrote and now
    drops (or writes as a non-object) nothing survives: the key is removed or replaced whole, as
    ``kubectl apply`` does."""
    kept: JSON = {}
    for key, value in foreign.items():
        if key not in last:
            kept[key] = value
        elif all(isinstance(x, dict) for x in (value, last[key], desired.get(key))):
            kept[key] = surviving(value, last[key], desired[key])
    return kept


@settings(max_examples=400)
@given(foreign=OBJECTS, last=OBJECTS, desired=OBJECTS)
def test_the_patch_turns_any_live_object_holding_the_record_into_desired_plus_others_keys(
    foreign: JSON, last: JSON, desired: JSON
) -> None:
    live = merge_patch(foreign, last)  # what the operator wrote, over what others set
    patch = three_way_patch(last, desired)
    result = merge_patch(live, patch)
    assert result == merge_patch(surviving(foreign, last, desired), desired)
    # every key written before and not wanted now is gone; applying it again changes nothing
    assert all(key in desired or key not in result for key in last)
    assert merge_patch(result, patch) == result


@settings(max_examples=200)
@given(foreign=OBJECTS, last=OBJECTS)
def test_an_unchanged_desired_object_changes_nothing(foreign: JSON, last: JSON) -> None:
    live = merge_patch(foreign, last)
    assert merge_patch(live, three_way_patch(last, last)) == live


@settings(max_examples=200)
@given(live=OBJECTS, desired=OBJECTS)
def test_without_a_record_the_patch_is_desired_and_removes_nothing(live: JSON, desired: JSON) -> None:
    # a child made by an operator that kept no record: today's merge patch, once
    assert three_way_patch(None, desired) == desired
    assert merge_patch(live, three_way_patch(None, desired)) == merge_patch(live, desired)


FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1")
REDIS = "redis://r:6379/0"


def gateway(router: JSON) -> JSON:
    spec = models.validate_spec({"model": {"name": "m"}, "engine": {"kind": "emulator"}, "router": router})
    (found,) = [c for c in desired_children(FLEET, spec, REDIS) if c["kind"] == "Deployment"]
    return found


def test_a_dropped_node_selector_and_label_are_nulled_and_the_rest_is_sent_as_is() -> None:
    template = {"metadata": {"labels": {"team": "ml"}}, "spec": {"nodeSelector": {"pool": "cpu"}}}
    before = with_last_applied(gateway({"podTemplate": template}))
    after = gateway({})
    patch = child_patch(after, before)
    pod = patch["spec"]["template"]
    assert pod["spec"]["nodeSelector"] is None
    assert pod["metadata"]["labels"]["team"] is None
    assert {k: v for k, v in pod["metadata"]["labels"].items() if v is not None} == (
        after["spec"]["template"]["metadata"]["labels"]
    )
    # the new record is written with it, and it is what the next update compares against
    record = patch["metadata"]["annotations"][ANNOTATION_LAST_APPLIED]
    assert parse_last_applied(with_last_applied(after)) == json.loads(record)
    assert "nodeSelector" not in json.dumps(json.loads(record))


def test_the_record_holds_what_an_update_writes_and_not_itself_nor_a_new_hash() -> None:
    manifest = gateway({"podTemplate": {"spec": {"nodeSelector": {"pool": "cpu"}}}})
    recorded = with_last_applied(manifest)
    record = parse_last_applied(recorded)
    assert record == owned_fields(manifest)
    assert set(record) == {"metadata", "spec"}
    assert set(record["metadata"]) == {"labels", "annotations", "ownerReferences"}
    assert ANNOTATION_LAST_APPLIED not in record["metadata"]["annotations"]
    # the spec hash deciding whether to update is the planner's, unchanged: no rollout on upgrade
    hash_before = manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    assert recorded["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == hash_before
    assert with_last_applied(recorded) == recorded  # recording twice records the same
    assert ANNOTATION_LAST_APPLIED not in manifest["metadata"]["annotations"]  # the input is not changed


@pytest.mark.parametrize(
    "annotation",
    [None, "", "not json", "[1, 2]", '"text"'],
    ids=["absent", "empty", "not JSON", "a list", "a string"],
)
def test_a_missing_or_unreadable_record_falls_back_to_removing_nothing(annotation: str | None) -> None:
    annotations = {} if annotation is None else {ANNOTATION_LAST_APPLIED: annotation}
    live: JSON = {"metadata": {"annotations": annotations}}
    assert parse_last_applied(live) is None
    manifest = gateway({})
    patch = child_patch(manifest, live)
    assert patch == owned_fields(with_last_applied(manifest))
    assert "null" not in json.dumps(patch)  # nothing removed


# ------------------------------------------------------------------ against the emulated API server

NAMESPACE = "default"
ROUTER = "f-router"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Kube]:
    with contextlib.closing(EmulatedCluster(tmp_path / "cluster")) as cluster:
        cluster.install_crd()
        yield Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))


def fleet(router: JSON) -> JSON:
    return {
        "apiVersion": "prefixfleet.io/v1alpha1",
        "kind": "PrefixCacheFleet",
        "metadata": {"name": "f", "namespace": NAMESPACE},
        "spec": {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 0, "router": router},
    }


def set_router(kube: Kube, router: JSON) -> None:
    # the whole router replaced, as `kubectl apply` of the edited fleet would leave it
    kube.request(
        "PATCH",
        Kube.path("PrefixCacheFleet", NAMESPACE, "f"),
        body={"spec": {"router": None}},
        content_type="application/merge-patch+json",
    )
    kube.request(
        "PATCH",
        Kube.path("PrefixCacheFleet", NAMESPACE, "f"),
        body={"spec": {"router": router}},
        content_type="application/merge-patch+json",
    )


def router_deployment(kube: Kube) -> JSON:
    found = kube.get("Deployment", NAMESPACE, ROUTER)
    assert found is not None
    return found


PLACED = {
    "podTemplate": {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {"nodeSelector": {"pool": "cpu"}, "imagePullSecrets": [{"name": "ghcr"}]},
    }
}


def test_a_node_selector_taken_out_of_the_fleet_leaves_the_gateway_deployment(kube: Kube) -> None:
    ctx = OperatorContext(kube=kube, default_redis_url="redis://default:6379/0")
    kube.create(fleet(PLACED))
    reconcile_in_cluster(ctx, NAMESPACE, "f")  # Redis is unreachable here: only the children matter
    placed = router_deployment(kube)["spec"]["template"]
    assert placed["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert placed["metadata"]["labels"]["team"] == "ml"
    # another controller's annotation, which the operator never wrote
    kube.annotate("Deployment", NAMESPACE, ROUTER, {"example.com/audited": "yes"})

    set_router(kube, {})
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    live = router_deployment(kube)
    pod = live["spec"]["template"]
    # before: nodeSelector, imagePullSecrets and the team label stayed (a merge patch removes nothing)
    assert "nodeSelector" not in pod["spec"]
    assert "imagePullSecrets" not in pod["spec"]
    assert "team" not in pod["metadata"]["labels"]
    annotations = live["metadata"]["annotations"]
    assert annotations["example.com/audited"] == "yes"
    (wanted,) = [c for c in desired_children_of(kube) if c["kind"] == "Deployment"]
    assert annotations[ANNOTATION_SPEC_HASH] == wanted["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    assert live["spec"] == wanted["spec"]

    # an unchanged fleet is not written again
    version = live["metadata"]["resourceVersion"]
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert router_deployment(kube)["metadata"]["resourceVersion"] == version


def desired_children_of(kube: Kube) -> list[JSON]:
    found = kube.get("PrefixCacheFleet", NAMESPACE, "f")
    assert found is not None
    ref = FleetRef(name="f", namespace=NAMESPACE, uid=found["metadata"]["uid"])
    return desired_children(ref, models.validate_spec(found["spec"]), "redis://default:6379/0")


def test_a_child_made_before_records_were_kept_gets_one_on_its_first_update(kube: Kube) -> None:
    # as an operator without records created it: no last-applied annotation
    old = gateway(PLACED)
    old["metadata"]["namespace"] = NAMESPACE
    assert kube.create(old) is True
    new = gateway({})
    new["metadata"]["namespace"] = NAMESPACE
    # first update: nothing is known to be the operator's, so nothing is removed (as before)
    kube.replace_spec(new, kube.get("Deployment", NAMESPACE, old["metadata"]["name"]))
    live = kube.get("Deployment", NAMESPACE, old["metadata"]["name"])
    assert live is not None
    assert live["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert parse_last_applied(live) == owned_fields(new)
    # once recorded, a later drop is removed
    changed = gateway({"podTemplate": {"spec": {"nodeSelector": {"zone": "a"}}}})
    changed["metadata"]["namespace"] = NAMESPACE
    kube.replace_spec(changed, live)
    live = kube.get("Deployment", NAMESPACE, old["metadata"]["name"])
    assert live is not None
    # "pool" was never in a record (the old operator wrote it): it stays; "zone" is the new desire
    assert live["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu", "zone": "a"}
    # the recorded nodeSelector dropped: removed whole, as kubectl apply removes a dropped field
    kube.replace_spec(new, live)
    live = kube.get("Deployment", NAMESPACE, old["metadata"]["name"])
    assert live is not None
    assert "nodeSelector" not in live["spec"]["template"]["spec"]
    assert live["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "ghcr"}]  # never recorded


def test_a_record_naming_fields_an_update_never_writes_removes_none_of_them() -> None:
    # A record edited by hand, or filled with the whole object: its identity, the API server's
    # fields, another controller's finalizer and the status are not the operator's to remove
    # (a null kind or name is refused by the API server every round; a null finalizers list drops
    # someone else's finalizer).
    manifest = gateway({})
    foreign_record = {
        **owned_fields(manifest),
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "status": {"replicas": 1},
    }
    foreign_record["metadata"] = {
        **foreign_record["metadata"],
        "name": "f-router",
        "namespace": "default",
        "uid": "u-1",
        "resourceVersion": "7",
        "finalizers": ["example.com/keep"],
        "generateName": "f-",
    }
    live: JSON = {"metadata": {"annotations": {ANNOTATION_LAST_APPLIED: json.dumps(foreign_record)}}}
    assert parse_last_applied(live) == owned_fields(manifest)
    patch = child_patch(manifest, live)
    assert set(patch) == {"metadata", "spec"}
    assert set(patch["metadata"]) == {"labels", "annotations", "ownerReferences"}
    assert "null" not in json.dumps(patch)  # the desired manifest is what the record said: nothing removed


@pytest.mark.parametrize("metadata", ["text", 5, ["labels"]])
def test_a_record_whose_metadata_is_no_object_removes_no_metadata(metadata: Any) -> None:
    manifest = gateway({})
    record = {**owned_fields(manifest), "metadata": metadata}
    live: JSON = {"metadata": {"annotations": {ANNOTATION_LAST_APPLIED: json.dumps(record)}}}
    patch = child_patch(manifest, live)
    assert "null" not in json.dumps(patch["metadata"])
    assert patch["metadata"] == owned_fields(with_last_applied(manifest))["metadata"]
