"""Which replica pods a plan relabels has one source: its label writes.

``ReconcilePlan.relabel_pods`` (what the reconcile patches) and ``label_writes`` (what the
LabelsChanged Event says, and after execution only what was carried out) were two lists the planner
built side by side from the same writes; one changed without the other would patch pods the Event
does not name, or name pods never patched. ``relabel_pods`` is now derived from ``label_writes``.
"""

from __future__ import annotations

from prefixfleet.operator.planner import LabelWrite, ObservedLabels, ReconcilePlan


def test_relabel_pods_are_the_pod_label_writes() -> None:
    pod = LabelWrite("f-replica-0", {"team": "b"}, ObservedLabels({"team": "a"}, {"team": "a"}), "pod")
    router = LabelWrite("Service/f-router", {"team": "b"}, ObservedLabels({"team": "a"}), "metadata")
    plan = ReconcilePlan(label_writes=(router, pod))
    # the pods' writes only, each as its merge patch (the record of what the operator wrote with it)
    [(name, patch)] = plan.relabel_pods
    assert name == "f-replica-0"
    assert patch["metadata"]["labels"]["team"] == "b"
    assert not plan.is_noop
    assert ReconcilePlan(label_writes=(router,)).relabel_pods == ()
