"""Every child the planner makes is one ``kopf.adopt`` would leave as it is.

The handlers called ``kopf.adopt(manifest, owner=fleet)`` on each replica pod and router child
before writing it: it adds the fleet as controller owner reference (apiVersion, kind, name, uid,
controller and blockOwnerDeletion true), sets the fleet's namespace where none is set, and gives the
child each of the fleet's labels it lacks. Since 2d2f16c the planner's manifests carry all of that
themselves (kopf.adopt is no longer called), so this checks they still do, by running kopf.adopt on
a copy and finding nothing to add, for a fleet whose labels collide with the operator's own.
"""

from __future__ import annotations

import copy

import kopf

from prefixfleet.operator import models
from prefixfleet.operator.planner import FleetRef, ObservedState, plan_reconcile

FLEET = {
    "apiVersion": "prefixfleet.io/v1alpha1",
    "kind": "PrefixCacheFleet",
    "metadata": {
        "name": "f",
        "namespace": "ns1",
        "uid": "uid-1",
        "labels": {
            "team": "a",
            # the operator's own (selector and app.kubernetes.io labels, the template hash) and a
            # podTemplate's: theirs win, as kopf.adopt (setdefault) let them
            "app.kubernetes.io/name": "x",
            "prefixfleet.io/role": "y",
            "prefixfleet.io/template-hash": "z",
            "pod-label": "from-the-fleet",
        },
    },
}
REF = FleetRef(name="f", namespace="ns1", uid="uid-1")
SPEC = models.validate_spec(
    {
        "model": {"name": "m"},
        "engine": {"kind": "emulator", "podTemplate": {"metadata": {"labels": {"pod-label": "own"}}}},
        "replicas": 2,
        "router": {"replicas": 1},
    }
)


def test_every_child_is_as_kopf_adopt_would_leave_it() -> None:
    plan = plan_reconcile(
        REF, SPEC, ObservedState(redis_url="redis://r:6379/0", fleet_labels=FLEET["metadata"]["labels"])
    )
    children = [*plan.create_pods, *(change.manifest for change in plan.children)]
    assert sorted(c["kind"] for c in children) == ["ConfigMap", "Deployment", "Pod", "Pod", "Service"]
    for child in children:
        adopted = copy.deepcopy(child)
        kopf.adopt(adopted, owner=FLEET)
        assert adopted == child, child["kind"]  # nothing to add: owner reference, namespace, labels
        assert child["metadata"]["namespace"] == "ns1"
        assert child["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "prefixfleet.io/v1alpha1",
                "kind": "PrefixCacheFleet",
                "name": "f",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = child["metadata"]["labels"]
        assert labels["team"] == "a" and labels["app.kubernetes.io/name"] == "prefixfleet", child["kind"]
        assert labels["prefixfleet.io/role"] in ("replica", "router"), child["kind"]
    for pod in plan.create_pods:
        assert pod["metadata"]["labels"]["pod-label"] == "own"
        assert pod["metadata"]["labels"]["prefixfleet.io/template-hash"] != "z"
