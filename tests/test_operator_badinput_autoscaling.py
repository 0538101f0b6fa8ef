"""Autoscaling knobs at the edges the models allow: the planner decides, it does not raise.

Specification: a spec whose ``targetLoad`` or ``leadTimeSeconds`` would make the planner's arithmetic
infinite (``targetLoad: 1e-310`` raised OverflowError in every autoscaler round) is refused by the
models (and the CRD, generated from them) naming the field; every spec they accept, at the extreme
values they allow, gives a plan for any demand, however high.
"""

from __future__ import annotations

import pytest

from prefixfleet.operator.autoscale import FleetObservation, PlannerMemory, ReplicaObservation, plan_scale
from prefixfleet.operator.autoscale_observe import scale_policy
from prefixfleet.operator.models import (
    MAX_LEAD_TIME_S,
    MAX_REPLICAS,
    MIN_TARGET_LOAD,
    InvalidFleetSpec,
    validate_spec,
)

BASE = {"model": {"name": "m"}, "engine": {"kind": "emulator"}}


@pytest.mark.parametrize(
    ("autoscaling", "field"),
    [
        ({"targetLoad": 1e-310, "scaleDownLoad": 1e-311}, "spec.autoscaling.targetLoad"),
        ({"targetLoad": MIN_TARGET_LOAD / 2, "scaleDownLoad": 0.001}, "spec.autoscaling.targetLoad"),
        ({"leadTimeSeconds": 1e308}, "spec.autoscaling.leadTimeSeconds"),
        ({"maxReplicas": MAX_REPLICAS + 1}, "spec.autoscaling.maxReplicas"),
    ],
)
def test_knobs_past_the_planners_range_are_refused_by_name(autoscaling: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidFleetSpec) as err:
        validate_spec({**BASE, "autoscaling": autoscaling})
    assert any(p.startswith(field) for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("load", [0.0, 0.5, 1e3, 1e12, 1e300])
@pytest.mark.parametrize("slope_ramp", [False, True])
def test_the_planner_plans_at_the_extremes_the_models_allow(load: float, slope_ramp: bool) -> None:
    spec = validate_spec(
        {
            **BASE,
            "replicas": 1,
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "maxReplicas": MAX_REPLICAS,
                "targetLoad": MIN_TARGET_LOAD,
                "scaleDownLoad": MIN_TARGET_LOAD / 2,
                "leadTimeSeconds": MAX_LEAD_TIME_S,
            },
        }
    )
    policy = scale_policy(spec)
    memory = PlannerMemory()
    now = 10_000.0
    loads = [0.0, load] if slope_ramp else [load, load]  # a jump makes the steepest trend
    plan = None
    for step, value in enumerate(loads):
        replica = ReplicaObservation("r0", "ready", prefill_load=value, created_s=0.0)
        plan = plan_scale(FleetObservation(now_s=now + step, replicas=(replica,)), policy, memory)
        memory = plan.memory
    assert plan is not None and 0 <= plan.desired_replicas <= MAX_REPLICAS
