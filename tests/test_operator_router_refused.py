"""A router child update the API server keeps refusing is said once, as a refusal.

When a change of the fleet's spec changes a router child (the gateway Deployment, its ConfigMap or
Service), the operator updates it and posts one ``RouterChanged`` Event, ``updating
Deployment/NAME-router``. An admission webhook (or any policy) may refuse that update, round after
round. Before, the round posted ``RouterChanged`` anyway, every 10 s, saying it was updating a child
the API server never took; the refusal itself was a refused child (Degraded=ChildRefused, one
Warning Event), which the claim buried. Now ``RouterChanged`` names only the router children the API
server took (``events_carried_out``), so a refused update posts the ChildRefused Event once (naming
the Deployment and the webhook's reason) and nothing more while the situation is unchanged; once the
update is taken, ``RouterChanged`` says it, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import PlannedEvent, events_carried_out, plan_reconcile
from tests.k8s.apiserver import ApiError, EmulatedApiServer, ResourceType
from tests.test_operator_fleet_label_changes import settled, spec
from tests.test_operator_fleet_labels import NAMESPACE, REDIS, REF, fleet_manifest
from tests.test_operator_refused_children import RefusingCluster

DENIAL = 'admission webhook "gateways.example.com" denied the request: gateway replicas are capped at 1'

# ------------------------------------------------------------------ the plan (plain data)


def test_router_changed_names_only_the_router_children_the_api_server_took() -> None:
    state = settled(spec(), {"team": "a"})
    plan = plan_reconcile(REF, spec(router={"replicas": 2}), state)
    assert [(e.reason, e.message) for e in plan.events] == [("RouterChanged", "updating Deployment/f-router")]
    # the update refused: no Event claims it (before: "updating Deployment/f-router", every round)
    assert events_carried_out(plan, []) == ()
    assert events_carried_out(plan, ["Deployment/f-router"]) == plan.events
    # a first round: the children the API server took, and only those
    first = plan_reconcile(REF, spec(), replace(state, children={}, child_labels={}))
    assert events_carried_out(first, ["ConfigMap/f-router", "Service/f-router"]) == (
        PlannedEvent("Normal", "RouterChanged", "creating ConfigMap/f-router, Service/f-router"),
    )


# ------------------------------------------------------------------ against the emulated API server


class GatewayWebhookApiServer(EmulatedApiServer):
    """The emulator behind a validating webhook that, while ``refusing``, denies any Deployment
    asking for more than one replica, in kube-apiserver's words for a webhook's denial."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = True
        self.refused = 0

    def _admit(self, rt: ResourceType, obj: Any) -> Any:
        replicas = int((obj.get("spec") or {}).get("replicas") or 0) if isinstance(obj, dict) else 0
        if rt.kind == "Deployment" and self.refusing and replicas > 1:
            self.refused += 1
            raise ApiError(400, "BadRequest", DENIAL)
        return super()._admit(rt, obj)


@pytest.fixture
def server() -> GatewayWebhookApiServer:
    return GatewayWebhookApiServer()


@pytest.fixture
def kube(tmp_path: Path, server: GatewayWebhookApiServer) -> Iterator[Kube]:
    """The emulated API server behind ``server``'s webhook, with the CRD, as a Kube."""
    emulated = RefusingCluster(tmp_path / "cluster", server)  # type: ignore[arg-type]
    try:
        emulated.install_crd()
        yield Kube(kubernetes.config.new_client_from_config(config_file=str(emulated.kubeconfig)))
    finally:
        emulated.close()


def said(ctx: OperatorContext) -> list[tuple[str, str]]:
    """One reconcile round as the operator runs it: the Events it posts, (reason, message)."""
    outcome = reconcile_in_cluster(ctx, NAMESPACE, "f")
    assert outcome is not None
    return [(e.reason, e.message) for e in outcome.events]


def degraded(kube: Kube) -> dict[str, Any]:
    fleet = kube.get("PrefixCacheFleet", NAMESPACE, "f") or {}
    return next(c for c in fleet["status"]["conditions"] if c["type"] == "Degraded")


def test_a_refused_router_update_is_said_once_as_a_refusal(
    kube: Kube, server: GatewayWebhookApiServer
) -> None:
    ctx = OperatorContext(kube=kube, default_redis_url=REDIS)
    kube.create(fleet_manifest({"team": "a"}))
    first = said(ctx)
    assert ("RouterChanged", "creating ConfigMap/f-router, Deployment/f-router, Service/f-router") in first

    # two gateway replicas: the webhook refuses the Deployment's update
    kube.merge_patch("PrefixCacheFleet", NAMESPACE, "f", {"spec": {"router": {"replicas": 2}}})
    refusal = f"the API server refused Deployment {NAMESPACE}/f-router (400 BadRequest): {DENIAL}"
    assert said(ctx) == [("ChildRefused", refusal)]  # before: RouterChanged "updating ..." too
    cond = degraded(kube)
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "ChildRefused", refusal)
    # the next rounds are refused the same: nothing new to say (before: "updating
    # Deployment/f-router" every round)
    assert said(ctx) == [] and said(ctx) == []
    assert server.refused == 3
    assert (kube.get("Deployment", NAMESPACE, "f-router") or {})["spec"]["replicas"] == 1

    # the webhook takes it: the update is said, once, and the refusal clears
    server.refusing = False
    assert said(ctx) == [("RouterChanged", "updating Deployment/f-router")]
    assert (kube.get("Deployment", NAMESPACE, "f-router") or {})["spec"]["replicas"] == 2
    assert degraded(kube)["reason"] != "ChildRefused"
    assert said(ctx) == []
