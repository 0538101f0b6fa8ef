"""Routing policy parameters: from the fleet spec to the gateway's policy, refused when wrong."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from prefixfleet.cli import main
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedState, plan_reconcile
from prefixfleet.router.cli import _policy_params

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1", generation=1)


def gateway_args(spec: FleetSpec) -> list[str]:
    observed = ObservedState(pods=[], children={}, redis_url="redis://r:6379/0", now=datetime.now(UTC))
    plan = plan_reconcile(FLEET, spec, observed)
    deployment = next(c.manifest for c in plan.children if c.manifest["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


def test_policy_params_in_the_spec_reach_the_gateway_command_line():
    spec = FleetSpec.model_validate(
        {
            "model": {"name": "m"},
            "engine": {"kind": "emulator"},
            "router": {"policy": "queue_aware", "policyParams": {"delay_weight": 0.5, "window_s": 20}},
        }
    )
    args = gateway_args(spec)
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--policy-param"]
    assert pairs == ["delay_weight=0.5", "window_s=20"]
    assert _policy_params("queue_aware", pairs) == {"delay_weight": 0.5, "window_s": 20.0}


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("nope=1", "queue_aware takes externality"),
        ("delay_weight", "expected KEY=NUMBER"),
        ("delay_weight=fast", "expected KEY=NUMBER"),
        ("delay_weight=-1", "delay_weight must be >= 0"),
    ],
)
def test_bad_policy_params_are_one_line_errors(pair, message, capsys):
    argv = ["router", "gateway", "--port", "1", "--worker", "http://127.0.0.1:9", "--policy-param", pair]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
