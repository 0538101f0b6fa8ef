"""The fleet's own labels reach its children, and a change of them reaches the children it made.

The operator gives every child (replica pods, the router ConfigMap, Deployment and Service, and the
gateway pods through the Deployment's pod template) the PrefixCacheFleet's metadata.labels besides
its own (its own win). Before, ``kopf.adopt`` added them at
creation only: the labels were in no hash, so ``kubectl label prefixcachefleet f team=b`` (or an
edited metadata.labels) reached no existing child. Now the planner compares each child's labels with
the fleet's and patches them in place (a pod is never replaced for a label: its engine keeps its GPU
and its cache), a label the fleet dropped leaves the children that got it from the fleet (the
``prefixfleet.io/last-applied`` record), and labels others put on children are left alone.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes

from prefixfleet.operator import models
from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.last_applied import ANNOTATION_LAST_APPLIED
from prefixfleet.operator.planner import (
    ANNOTATION_SPEC_HASH,
    LABEL_FLEET,
    LABEL_ROLE,
    FleetRef,
    ObservedLabels,
    ObservedState,
    observe_labels,
    observe_pod,
    plan_reconcile,
    replica_template,
)
from tests.k8s.cluster import operator_in_cluster, running_redis, wait_for

# the emulated API server with the CRD, as a Kube (a fixture)
from tests.test_operator_last_applied import kube  # noqa: F401

JSON = dict[str, Any]
REF = FleetRef(name="f", namespace="default", uid="uid-1")
REDIS = "redis://default:6379/0"
SPEC = models.validate_spec(
    {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 2, "router": {"replicas": 1}}
)

# ------------------------------------------------------------------ the plan (plain data)


def first_round(labels: dict[str, str]) -> tuple[ObservedState, list[JSON], list[JSON]]:
    """What a first reconcile of a fleet labelled ``labels`` creates, and the state it leaves."""
    plan = plan_reconcile(REF, SPEC, ObservedState(redis_url=REDIS, fleet_labels=labels))
    pods = list(plan.create_pods)
    children = [c.manifest for c in plan.children]
    assert len(pods) == 2 and [c.action for c in plan.children] == ["create"] * 3
    state = ObservedState(
        pods=[observe_pod(p) for p in pods],
        children={
            f"{c['kind']}/{c['metadata']['name']}": c["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
            for c in children
        },
        # the handler records each child as created with its last-applied record
        child_labels={
            f"{c['kind']}/{c['metadata']['name']}": ObservedLabels(
                c["metadata"]["labels"], c["metadata"]["labels"]
            )
            for c in children
        },
        redis_url=REDIS,
        fleet_labels=labels,
    )
    return state, pods, children


def test_children_are_created_with_the_fleets_labels_and_the_operators_own_win() -> None:
    _, pods, children = first_round({"team": "a", LABEL_FLEET: "other", LABEL_ROLE: "x"})
    for child in [*pods, *children]:
        labels = child["metadata"]["labels"]
        assert labels["team"] == "a"
        assert labels[LABEL_FLEET] == "f"  # the selector labels stay the operator's
        assert labels[LABEL_ROLE] in ("replica", "router")
    # a pod records the fleet labels it got, which a later update compares against
    record = json.loads(pods[0]["metadata"]["annotations"][ANNOTATION_LAST_APPLIED])
    assert record == {"metadata": {"labels": {"team": "a"}}}
    # the gateway pods carry them too (their template), its own still winning; the selector is the
    # operator's alone (immutable: a fleet label in it would make every later label change fail)
    (deployment,) = [c for c in children if c["kind"] == "Deployment"]
    gateway = deployment["spec"]["template"]["metadata"]["labels"]
    assert (gateway["team"], gateway[LABEL_FLEET], gateway[LABEL_ROLE]) == ("a", "f", "router")
    assert deployment["spec"]["selector"] == {"matchLabels": {LABEL_FLEET: "f", LABEL_ROLE: "router"}}


def test_the_fleets_labels_are_in_no_hash() -> None:
    template_hash = replica_template(REF, SPEC, REDIS)[1]
    _, pods_a, children_a = first_round({"team": "a"})
    _, pods_b, children_b = first_round({"team": "b", "cost": "x"})
    assert {p["metadata"]["labels"]["prefixfleet.io/template-hash"] for p in [*pods_a, *pods_b]} == {
        template_hash
    }
    for a, b in zip(children_a, children_b, strict=True):
        hashes = [c["metadata"]["annotations"][ANNOTATION_SPEC_HASH] for c in (a, b)]
        assert hashes[0] == hashes[1], a["kind"]
        # the gateway pods' labels aside (the fleet's are in their template), the same spec
        assert without_pod_labels(a.get("spec")) == without_pod_labels(b.get("spec"))
        assert a.get("data") == b.get("data")


def without_pod_labels(spec: JSON | None) -> JSON | None:
    if spec is None or "template" not in spec:
        return spec
    out = copy.deepcopy(spec)
    del out["template"]["metadata"]["labels"]
    return out


def test_a_label_change_is_patched_in_place_and_rolls_nothing() -> None:
    state, pods, _ = first_round({"team": "a", "cost": "x"})
    plan = plan_reconcile(REF, SPEC, state)
    assert plan.is_noop  # unchanged labels: nothing to write

    changed = plan_reconcile(REF, SPEC, replace(state, fleet_labels={"team": "b"}))
    assert not changed.create_pods and not changed.delete_pods and not changed.drain_pods
    patches = dict(changed.relabel_pods)
    assert set(patches) == {p["metadata"]["name"] for p in pods}
    for patch in patches.values():
        # team set, cost (recorded, dropped by the fleet) removed; nothing else of the pod touched
        assert patch == {
            "metadata": {
                "labels": {"team": "b", "cost": None},
                "annotations": {ANNOTATION_LAST_APPLIED: '{"metadata":{"labels":{"team":"b"}}}'},
            }
        }
    assert [c.action for c in changed.children] == ["replace"] * 3
    for change in changed.children:
        labels = change.manifest["metadata"]["labels"]
        assert labels["team"] == "b" and "cost" not in labels


def test_labels_others_set_on_a_child_do_not_make_it_stale() -> None:
    desired = {"team": "a"}
    assert not_stale(ObservedLabels({"team": "a", "example.com/owner": "me"}, {"team": "a"}), desired)
    # a child made by an operator that kept no record: written only if a label is missing or differs
    assert not_stale(ObservedLabels({"team": "a", "cost": "x"}, None), desired)
    assert not not_stale(ObservedLabels({"team": "b"}, None), desired)
    # a label recorded as the operator's and dropped by the fleet is removed, even if someone else
    # removed it already (the record is brought up to date)
    assert not not_stale(ObservedLabels({"team": "a", "cost": "x"}, {"team": "a", "cost": "x"}), desired)
    assert not not_stale(ObservedLabels({"team": "a"}, {"team": "a", "cost": "x"}), desired)


def not_stale(observed: ObservedLabels, desired: dict[str, str]) -> bool:
    state, _, _ = first_round(desired)
    plan = plan_reconcile(REF, SPEC, replace(state, pods=[replace(p, labels=observed) for p in state.pods]))
    return not plan.relabel_pods


# ------------------------------------------------------------------ against the emulated API server

NAMESPACE = "default"
FOREIGN = "example.com/owner"


def fleet_manifest(labels: dict[str, str]) -> JSON:
    return {
        "apiVersion": "prefixfleet.io/v1alpha1",
        "kind": "PrefixCacheFleet",
        "metadata": {"name": "f", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "model": {"name": "m"},
            "engine": {"kind": "emulator"},
            "replicas": 2,
            "router": {"replicas": 1},
        },
    }


def label_fleet(api: Kube, labels: dict[str, str | None]) -> None:
    """What `kubectl label pcf f KEY=VALUE KEY-` sends (a merge patch of metadata.labels)."""
    api.merge_patch("PrefixCacheFleet", NAMESPACE, "f", {"metadata": {"labels": labels}})


def children(api: Kube) -> dict[str, JSON]:
    found = {f"Pod/{p['metadata']['name']}": p for p in api.list("Pod", NAMESPACE, f"{LABEL_FLEET}=f")}
    for kind in ("ConfigMap", "Deployment", "Service"):
        child = api.get(kind, NAMESPACE, "f-router")
        assert child is not None
        found[f"{kind}/f-router"] = child
    return found


def versions(api: Kube) -> dict[str, str]:
    return {key: child["metadata"]["resourceVersion"] for key, child in children(api).items()}


def test_a_fleet_label_change_reaches_every_child_in_place(kube: Kube) -> None:  # noqa: F811
    ctx = OperatorContext(kube=kube, default_redis_url=REDIS)
    kube.create(fleet_manifest({"team": "a", "cost-center": "x"}))
    reconcile_in_cluster(ctx, NAMESPACE, "f")  # Redis is unreachable here: only the children matter
    before = children(kube)
    assert len(before) == 5
    assert all(c["metadata"]["labels"]["team"] == "a" for c in before.values())
    deployment_spec = copy.deepcopy(before["Deployment/f-router"]["spec"])
    # labels others put on the children: never the operator's to change or remove
    for key in before:
        kind, name = key.split("/")
        kube.merge_patch(kind, NAMESPACE, name, {"metadata": {"labels": {FOREIGN: "me"}}})

    label_fleet(kube, {"team": "b", "cost-center": None, "tier": "gpu"})
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    after = children(kube)
    assert set(after) == set(before)  # no pod replaced, none added
    for key, child in after.items():
        labels = child["metadata"]["labels"]
        # before: team=a, cost-center=x and no tier on every child (the label change reached none)
        assert (labels["team"], labels.get("tier"), "cost-center" in labels) == ("b", "gpu", False), key
        assert labels[FOREIGN] == "me", key
        assert labels[LABEL_FLEET] == "f", key
        assert child["metadata"]["uid"] == before[key]["metadata"]["uid"], key
    # the replica pods' spec is as it was: no replica restarts
    for key, child in after.items():
        if key.startswith("Pod/"):
            assert child["spec"] == before[key]["spec"]
    # the gateway pods' template has the fleet's new labels (Kubernetes rolls the stateless
    # gateways to relabel them), nothing else of the Deployment's spec changed, its selector least
    gateway_spec = copy.deepcopy(after["Deployment/f-router"]["spec"])
    gateway = gateway_spec["template"]["metadata"].pop("labels")
    assert (gateway["team"], gateway.get("tier"), "cost-center" in gateway) == ("b", "gpu", False)
    assert gateway[LABEL_FLEET] == "f" and FOREIGN not in gateway
    del deployment_spec["template"]["metadata"]["labels"]
    assert gateway_spec == deployment_spec

    # converged: the next round writes nothing
    settled = versions(kube)
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert versions(kube) == settled

    # every fleet label removed: the children keep only their own labels and others'
    kube.merge_patch("PrefixCacheFleet", NAMESPACE, "f", {"metadata": {"labels": None}})
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    for key, child in children(kube).items():
        labels = child["metadata"]["labels"]
        assert "team" not in labels and "tier" not in labels, key
        assert labels[FOREIGN] == "me", key
    gateway = children(kube)["Deployment/f-router"]["spec"]["template"]["metadata"]["labels"]
    assert "team" not in gateway and "tier" not in gateway and gateway[LABEL_ROLE] == "router"


def test_pods_made_before_the_record_get_one_with_their_first_label_change(kube: Kube) -> None:  # noqa: F811
    ctx = OperatorContext(kube=kube, default_redis_url=REDIS)
    kube.create(fleet_manifest({"team": "a"}))
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    # as an operator without pod records left them (kopf.adopt gave the labels): no record
    for pod in kube.list("Pod", NAMESPACE, f"{LABEL_FLEET}=f"):
        kube.annotate("Pod", NAMESPACE, pod["metadata"]["name"], {ANNOTATION_LAST_APPLIED: None})
    settled = versions(kube)
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert versions(kube) == settled  # labels already right: an upgrade writes nothing
    label_fleet(kube, {"team": "b"})
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    for pod in kube.list("Pod", NAMESPACE, f"{LABEL_FLEET}=f"):
        assert pod["metadata"]["labels"]["team"] == "b"
        assert observe_labels(pod).recorded == {"team": "b"}
    # recorded now: a later removal leaves the pods
    label_fleet(kube, {"team": None})
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert all("team" not in p["metadata"]["labels"] for p in kube.list("Pod", NAMESPACE, f"{LABEL_FLEET}=f"))


# ------------------------------------------------------------------ the running operator


def test_a_labels_only_change_triggers_a_reconcile_without_waiting_for_the_timer(tmp_path: Path) -> None:
    # The timer is an hour away: only kopf's update handler (a fleet's labels are part of the
    # essence kopf diffs) can bring the change to the children within the wait.
    with (
        running_redis(tmp_path) as redis_url,
        operator_in_cluster(
            tmp_path, redis_url, kubelet=False, extra_env={"PREFIXFLEET_RECONCILE_INTERVAL": "3600"}
        ) as (cluster, _),
    ):
        kube = Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        cluster.apply(json.dumps(fleet_manifest({"team": "a"})))

        def labelled(team: str) -> dict[str, JSON] | None:
            found = children_or_none(kube) or {}
            if len(found) == 5 and all(c["metadata"]["labels"].get("team") == team for c in found.values()):
                return found
            return None

        first = wait_for(lambda: labelled("a"), 60, what="the fleet's children labelled team=a")
        cluster.kubectl("label", "prefixcachefleet", "f", "team=b", "--overwrite")
        then = wait_for(lambda: labelled("b"), 60, what="the fleet's children relabelled team=b")
        assert {k: c["metadata"]["uid"] for k, c in then.items()} == {
            k: c["metadata"]["uid"] for k, c in first.items()
        }


def children_or_none(api: Kube) -> dict[str, JSON] | None:
    try:
        return children(api)
    except AssertionError:  # the router children are not all created yet
        return None
