"""The Ready condition's message names the router only when the spec asks for one."""

from __future__ import annotations

from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import (
    FleetRef,
    ObservedPod,
    ObservedState,
    plan_reconcile,
    replica_template,
)

FLEET = FleetRef(name="f", namespace="default", uid="u")


def ready_condition(router: dict[str, object], router_ready_replicas: int) -> dict[str, object]:
    spec = validate_spec(
        {
            "replicas": 1,
            "engine": {"kind": "emulator"},
            "model": {"name": "m"},
            "router": router,
            "redis": {"url": "redis://r:6379/0"},
        }
    )
    _, template_hash = replica_template(FLEET, spec, "")
    pod = ObservedPod(
        name="f-replica-0",
        template_hash=template_hash,
        phase="Running",
        ready=True,
        pod_ip="10.0.0.1",
        created="2026-01-01T00:00:00Z",
    )
    observed = ObservedState(pods=[pod], router_ready_replicas=router_ready_replicas)
    plan = plan_reconcile(FLEET, spec, observed)
    return next(c for c in plan.status["conditions"] if c["type"] == "Ready")


def test_no_router_requested_is_not_called_ready() -> None:
    cond = ready_condition({"replicas": 0}, router_ready_replicas=0)
    assert cond["status"] == "True"
    assert cond["message"] == "1/1 replicas ready, no router requested"


def test_requested_router_that_is_ready_is_named() -> None:
    cond = ready_condition({"replicas": 1}, router_ready_replicas=1)
    assert cond["status"] == "True"
    assert cond["message"] == "1/1 replicas ready, router ready"
