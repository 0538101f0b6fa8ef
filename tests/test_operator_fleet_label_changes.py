"""A change of the fleet's labels: the gateway pods get them, a rolling update keeps each pod's own
labels, and ``kubectl describe`` shows one Event for it.

1. The gateway pods carry the fleet's labels through the Deployment's pod template, as the replica
   pods and the other children do (``kubectl get pods -l team=x`` finds the whole fleet). Before, the
   template kept them off. The selector stays the operator's (immutable), and a Deployment written
   by an operator that kept them off its template is found stale by its template's labels.
2. A pod on an outdated template is relabelled by its own template's labels, not the new one's:
   before, a label the new template sets itself (spec.engine.podTemplate) was taken off the old pods
   (``kubectl get pods -l team=b`` lost them mid-rollout), and one their template set was overwritten.
3. One label change posted three RouterChanged Events (one per router child), and nothing for the
   pods. Now it is one LabelsChanged Event naming the labels set and removed and what they reach, and
   RouterChanged is one Event per round for the router children created or whose spec changed.
   Once the plan ran, the Event says only the writes the API server took (events_carried_out).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prefixfleet.operator import models
from prefixfleet.operator.last_applied import ANNOTATION_LAST_APPLIED, with_last_applied
from prefixfleet.operator.planner import (
    ANNOTATION_SPEC_HASH,
    LABEL_FLEET,
    LABEL_ROLE,
    ObservedState,
    ReconcilePlan,
    events_carried_out,
    observe_labels,
    observe_pod,
    plan_reconcile,
)
from tests.test_operator_fleet_labels import REDIS, REF

JSON = dict[str, Any]


def spec(engine: JSON | None = None, router: JSON | None = None) -> models.FleetSpec:
    return models.validate_spec(
        {
            "model": {"name": "m"},
            "engine": {"kind": "emulator", **(engine or {})},
            "replicas": 2,
            "router": {"replicas": 1, **(router or {})},
        }
    )


def settled(fleet_spec: models.FleetSpec, labels: dict[str, str]) -> ObservedState:
    """The cluster after a first reconcile of a fleet labelled ``labels``, observed as the handler
    observes it: children created with their last-applied record, pods Ready and serving."""
    plan = plan_reconcile(REF, fleet_spec, ObservedState(redis_url=REDIS, fleet_labels=labels))
    created = [with_last_applied(c.manifest) for c in plan.children]
    pods = [replace(observe_pod(p), ready=True, phase="Running", first_ready="t") for p in plan.create_pods]
    return ObservedState(
        pods=pods,
        children={keyed(c): c["metadata"]["annotations"][ANNOTATION_SPEC_HASH] for c in created},
        child_labels={keyed(c): observe_labels(c) for c in created},
        redis_url=REDIS,
        fleet_labels=labels,
    )


def keyed(child: JSON) -> str:
    return f"{child['kind']}/{child['metadata']['name']}"


def gateway_labels(plan: ReconcilePlan) -> dict[str, str]:
    (deployment,) = [c.manifest for c in plan.children if c.manifest["kind"] == "Deployment"]
    assert deployment["spec"]["selector"] == {"matchLabels": {LABEL_FLEET: "f", LABEL_ROLE: "router"}}
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


# ------------------------------------------------------------------ 1. the gateway pods


def test_the_gateway_pods_get_the_fleets_labels_and_a_change_of_them() -> None:
    first = plan_reconcile(REF, spec(), ObservedState(redis_url=REDIS, fleet_labels={"team": "a"}))
    assert gateway_labels(first)["team"] == "a"  # before: no team label on the gateway pods

    state = settled(spec(), {"team": "a", "cost": "x"})
    assert plan_reconcile(REF, spec(), state).is_noop
    changed = plan_reconcile(REF, spec(), replace(state, fleet_labels={"team": "b"}))
    labels = gateway_labels(changed)
    assert (labels["team"], "cost" in labels, labels[LABEL_ROLE]) == ("b", False, "router")
    # the same spec hash: labels are in no hash, the update is a label update
    (deployment,) = [c for c in changed.children if c.manifest["kind"] == "Deployment"]
    assert deployment.labels_only


def test_a_router_pod_template_label_wins_over_the_fleets() -> None:
    with_team = spec(router={"podTemplate": {"metadata": {"labels": {"team": "ml"}}}})
    state = settled(with_team, {"team": "a", "tier": "gpu"})
    (deployment,) = [c for c in state.child_labels if c.startswith("Deployment/")]
    template = state.child_labels[deployment].pod_template
    assert template is not None and (template["team"], template["tier"]) == ("ml", "gpu")
    assert state.child_labels[deployment].live["team"] == "a"  # the Deployment's own metadata
    assert plan_reconcile(REF, with_team, state).is_noop


def test_a_deployment_whose_template_lacks_the_fleets_labels_is_updated() -> None:
    # as an operator that kept the fleet's labels off the gateway pods left it: its own labels (and
    # its record of them) are right, its pod template's are not
    state = settled(spec(), {"team": "a"})
    key = next(k for k in state.child_labels if k.startswith("Deployment/"))
    old = state.child_labels[key]
    assert old.pod_template is not None and old.pod_template["team"] == "a"
    without = {k: v for k, v in old.pod_template.items() if k != "team"}
    stale = replace(old, pod_template=without)
    plan = plan_reconcile(REF, spec(), replace(state, child_labels={**state.child_labels, key: stale}))
    assert [c.key for c in plan.children] == [key] and plan.children[0].labels_only
    assert gateway_labels(plan)["team"] == "a"
    (event,) = plan.events
    assert event.message == (
        "fleet labels changed (set team=a): relabelling Deployment/f-router in place; the gateway pods"
        " roll to carry them (the Deployment's pod template)"
    )


def test_a_router_pod_template_label_change_is_a_router_change_only() -> None:
    # the template's own labels are in its spec hash: a spec change, not the fleet's labels
    state = settled(spec(), {"team": "a"})
    changed = spec(router={"podTemplate": {"metadata": {"labels": {"tier": "gpu"}}}})
    plan = plan_reconcile(REF, changed, state)
    assert gateway_labels(plan)["tier"] == "gpu"
    assert [(e.reason, e.message) for e in plan.events] == [("RouterChanged", "updating Deployment/f-router")]


# ------------------------------------------------------------------ 2. pods on an outdated template


def rolling(old: models.FleetSpec, new: models.FleetSpec, labels: dict[str, str]) -> ReconcilePlan:
    """The plan that starts rolling from ``old`` to ``new`` (another template) with the fleet
    labelled ``labels``: both old pods serve on, one new pod is created (surge 1)."""
    state = settled(old, labels)
    plan = plan_reconcile(REF, new, state)
    assert len(plan.create_pods) == 1 and not plan.delete_pods and not plan.drain_pods
    return plan


def test_an_old_pod_keeps_a_fleet_label_the_new_template_sets_itself() -> None:
    # the new template sets team itself: new pods carry team=ml; the old ones got team=b from the
    # fleet and keep it until they go (before: it was removed from them at once)
    new = spec(engine={"podTemplate": {"metadata": {"labels": {"team": "ml"}}}})
    plan = rolling(spec(), new, {"team": "b"})
    assert plan.create_pods[0]["metadata"]["labels"]["team"] == "ml"
    assert not plan.relabel_pods


def test_an_old_pod_keeps_a_label_its_own_template_set() -> None:
    # the old template set team=ml, the new one does not: the old pods keep team=ml (their
    # template's) rather than take the fleet's team=b (before: overwritten)
    old = spec(engine={"podTemplate": {"metadata": {"labels": {"team": "ml"}}}})
    plan = rolling(old, spec(), {"team": "b"})
    assert plan.create_pods[0]["metadata"]["labels"]["team"] == "b"
    assert not plan.relabel_pods


def test_old_pods_still_follow_a_change_of_the_fleets_labels() -> None:
    old = spec(engine={"podTemplate": {"metadata": {"labels": {"team": "ml"}}}})
    state = settled(old, {"team": "b", "cost": "x"})
    plan = plan_reconcile(REF, spec(), replace(state, fleet_labels={"team": "c", "tier": "gpu"}))
    assert len(plan.create_pods) == 1  # the rollout goes on
    patches = dict(plan.relabel_pods)
    assert sorted(patches) == sorted(p.name for p in state.pods)
    for patch in patches.values():
        # tier set, cost (the fleet's, dropped) removed, team (its template's) left alone
        assert patch["metadata"]["labels"] == {"tier": "gpu", "cost": None}
        record = json.loads(patch["metadata"]["annotations"][ANNOTATION_LAST_APPLIED])
        assert record == {"metadata": {"labels": {"tier": "gpu"}}}


def test_an_old_pod_without_a_record_only_gets_the_labels_it_lacks() -> None:
    # made by an operator that kept no record: which of its labels its template set is unknown, so
    # none is overwritten on a pod that is being replaced anyway
    old = spec(engine={"podTemplate": {"metadata": {"labels": {"team": "ml"}}}})
    state = settled(old, {"team": "b"})
    pods = [replace(p, labels=replace(p.labels, recorded=None)) for p in state.pods]
    plan = plan_reconcile(REF, spec(), replace(state, pods=pods, fleet_labels={"team": "b", "tier": "gpu"}))
    for _, patch in plan.relabel_pods:
        assert patch["metadata"]["labels"] == {"tier": "gpu"}
    assert len(plan.relabel_pods) == 2


# ------------------------------------------------------------------ 3. one Event per change


def test_a_label_change_is_one_event_naming_the_labels_and_what_they_reach() -> None:
    state = settled(spec(), {"team": "a", "cost": "x"})
    plan = plan_reconcile(REF, spec(), replace(state, fleet_labels={"team": "b", "tier": "gpu"}))
    assert len(plan.children) == 3 and len(plan.relabel_pods) == 2
    (event,) = plan.events  # before: three RouterChanged Events, one per router child
    assert (event.type, event.reason) == ("Normal", "LabelsChanged")
    assert event.message == (
        "fleet labels changed (set team=b, tier=gpu; removed cost): relabelling ConfigMap/f-router,"
        " Deployment/f-router, Service/f-router, 2 replica pods in place; the gateway pods roll to"
        " carry them (the Deployment's pod template)"
    )


def test_a_new_fleet_is_one_router_event() -> None:
    plan = plan_reconcile(REF, spec(), ObservedState(redis_url=REDIS, fleet_labels={"team": "a"}))
    router = [e for e in plan.events if e.reason == "RouterChanged"]
    assert [e.message for e in router] == [
        "creating ConfigMap/f-router, Deployment/f-router, Service/f-router"
    ]
    assert not [e for e in plan.events if e.reason == "LabelsChanged"]


def test_a_router_spec_change_with_a_label_change_is_two_events() -> None:
    state = settled(spec(), {"team": "a"})
    plan = plan_reconcile(REF, spec(router={"replicas": 2}), replace(state, fleet_labels={"team": "b"}))
    by_reason = {e.reason: e.message for e in plan.events}
    assert sorted(by_reason) == ["LabelsChanged", "RouterChanged"]
    assert by_reason["RouterChanged"] == "updating Deployment/f-router"
    assert by_reason["LabelsChanged"].startswith("fleet labels changed (set team=b): relabelling")
    # the label change alone: no RouterChanged, the spec change alone: no LabelsChanged
    labels_only = plan_reconcile(REF, spec(), replace(state, fleet_labels={"team": "b"}))
    assert [e.reason for e in labels_only.events] == ["LabelsChanged"]
    spec_only = plan_reconcile(REF, spec(router={"replicas": 2}), state)
    assert [e.reason for e in spec_only.events] == ["RouterChanged"]


def test_the_event_says_only_the_label_writes_carried_out() -> None:
    # the handler passes the pods and children the API server took (an admission policy may refuse
    # the others, round after round): the Event says those, and none when nothing was written
    state = settled(spec(), {"team": "a"})
    plan = plan_reconcile(REF, spec(), replace(state, fleet_labels={"team": "b"}))
    pods = [name for name, _ in plan.relabel_pods]
    everything = [*pods, *(c.key for c in plan.children)]
    assert events_carried_out(plan, everything) == plan.events
    assert events_carried_out(plan, []) == ()
    (event,) = events_carried_out(plan, pods)
    assert event.message == "fleet labels changed (set team=b): relabelling 2 replica pods in place"
