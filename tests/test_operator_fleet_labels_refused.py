"""A replica pod's label update the API server refuses is reported, and the round goes on.

The fleet's labels reach its replica pods by a merge patch of their labels (ReconcilePlan.relabel_pods,
tests/test_operator_fleet_labels.py). An admission policy may refuse such a patch: here a validating
webhook that requires every Pod to carry a ``team`` label (as Gatekeeper's or Kyverno's
required-labels policies do, on updates as on creates), and the fleet's ``team`` label is taken off.
Before, the refusal escaped the reconcile as an ApiException at the first pod: nothing after it in
the round ran (the router children kept the old labels, no status was written) and every round
failed the same way. Now it is one more refused child: Degraded=ChildRefused names the pod and the
webhook's reason, the router children and the status are written as usual, and the pods keep
running with their labels as they were.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import LABEL_FLEET
from tests.k8s.apiserver import ApiError, EmulatedApiServer, ResourceType
from tests.test_operator_fleet_labels import NAMESPACE, REDIS, fleet_manifest, label_fleet
from tests.test_operator_refused_children import RefusingCluster

REQUIRED = "team"


class RequiredLabelApiServer(EmulatedApiServer):
    """The emulator behind a validating webhook refusing any Pod (created or updated) without a
    ``team`` label, in kube-apiserver's words for a webhook's denial."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_pods: list[str] = []

    def _admit(self, rt: ResourceType, obj: Any) -> Any:
        if rt.kind == "Pod" and isinstance(obj, dict):
            meta = obj.get("metadata") or {}
            if REQUIRED not in (meta.get("labels") or {}):
                self.refused_pods.append(meta.get("name", ""))
                raise ApiError(
                    403,
                    "Forbidden",
                    'admission webhook "labels.example.com" denied the request:'
                    f" pods must have a {REQUIRED!r} label",
                )
        return super()._admit(rt, obj)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[RefusingCluster, RequiredLabelApiServer]]:
    server = RequiredLabelApiServer()
    with contextlib.closing(RefusingCluster(tmp_path / "cluster", server)) as cluster:  # type: ignore[arg-type]
        cluster.install_crd()
        yield cluster, server


def conditions(kube: Kube) -> dict[str, dict[str, Any]]:
    fleet = kube.get("PrefixCacheFleet", NAMESPACE, "f") or {}
    return {c["type"]: c for c in (fleet.get("status") or {}).get("conditions") or []}


def test_a_refused_pod_relabel_is_a_refused_child_and_the_round_goes_on(
    cluster: tuple[RefusingCluster, RequiredLabelApiServer],
) -> None:
    emulated, server = cluster
    kube = Kube(kubernetes.config.new_client_from_config(config_file=str(emulated.kubeconfig)))
    ctx = OperatorContext(kube=kube, default_redis_url=REDIS)
    kube.create(fleet_manifest({REQUIRED: "a", "tier": "x"}))
    reconcile_in_cluster(ctx, NAMESPACE, "f")  # the pods carry team=a: admitted
    pods = {p["metadata"]["name"]: p for p in kube.list("Pod", NAMESPACE, f"{LABEL_FLEET}=f")}
    assert len(pods) == 2 and not server.refused_pods

    label_fleet(kube, {REQUIRED: None, "tier": "y"})
    outcome = reconcile_in_cluster(ctx, NAMESPACE, "f")  # before: ApiException (403) out of the round

    # the webhook refused the pods' patch (the first, and the next: a webhook may judge pods one
    # by one; two refusals end the round's pod relabels)
    assert server.refused_pods == sorted(pods)
    degraded = conditions(kube)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "ChildRefused")
    assert "Pod default/f-replica-0" in degraded["message"]
    assert "pods must have a 'team' label" in degraded["message"]
    # the rest of the round ran: the router children carry the fleet's labels now
    for kind in ("ConfigMap", "Deployment", "Service"):
        labels = (kube.get(kind, NAMESPACE, "f-router") or {})["metadata"]["labels"]
        assert (labels.get("tier"), REQUIRED in labels) == ("y", False), kind
    # the pods run on as they were: same pods, labels untouched
    for name, pod in pods.items():
        now = kube.get("Pod", NAMESPACE, name) or {}
        assert now["metadata"]["uid"] == pod["metadata"]["uid"]
        assert now["metadata"]["labels"] == pod["metadata"]["labels"]
    # the fleet's Event says what was relabelled: the router children, not the refused pods
    assert outcome is not None
    (said,) = [e.message for e in outcome.events if e.reason == "LabelsChanged"]
    assert "ConfigMap/f-router" in said and "replica pod" not in said
    # the next round is refused the same: no second LabelsChanged Event (before: one per round, every
    # 10 s while the webhook refuses, saying the pods were being relabelled)
    again = reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert again is not None and not [e for e in again.events if e.reason == "LabelsChanged"]

    # the fleet's team label back (tier=y stays): the pods are relabelled and the refusal clears
    label_fleet(kube, {REQUIRED: "b"})
    reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert conditions(kube)["Degraded"]["reason"] != "ChildRefused"
    for pod in kube.list("Pod", NAMESPACE, f"{LABEL_FLEET}=f"):
        assert (pod["metadata"]["labels"][REQUIRED], pod["metadata"]["labels"].get("tier")) == ("b", "y")
