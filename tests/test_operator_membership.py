"""Which replicas the gateways may route to, as the operator publishes it (pure)."""

from __future__ import annotations

import json

from prefixfleet.operator.membership import desired_members, plan_membership
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import ObservedPod
from prefixfleet.router.records import decode_member

SPEC = FleetSpec.model_validate({"model": {"name": "m", "revision": "r1"}, "engine": {"kind": "emulator"}})


def pod(name: str, ready: bool = True, **kw: object) -> ObservedPod:
    return ObservedPod(name=name, phase="Running", ready=ready, pod_ip="10.0.0.1", **kw)


def test_only_ready_pods_with_an_address_are_members_at_their_sidecar() -> None:
    pods = [pod("a"), pod("b", ready=False), pod("c", terminating=True), ObservedPod(name="d", ready=True),
            pod("e", state="draining"), pod("f", port_map={8100: 41001})]  # fmt: skip
    members = desired_members(SPEC, pods, now=1.0)
    assert sorted(members) == ["a", "e", "f"]
    assert members["a"].url == "http://10.0.0.1:8100" and members["f"].url == "http://10.0.0.1:41001"
    assert members["e"].state == "draining"
    assert (members["a"].model, members["a"].revision) == ("m", "r1")


def test_the_plan_writes_only_changes_and_removes_stale_members() -> None:
    desired = desired_members(SPEC, [pod("a"), pod("b")], now=1.0)
    first = plan_membership(desired, {"gone": "{}"})
    assert sorted(first.set) == ["a", "b"] and first.delete == ("gone",)
    assert decode_member(first.set["a"]).url == "http://10.0.0.1:8100"
    # the same records written at another time are not rewritten
    later = desired_members(SPEC, [pod("a"), pod("b")], now=99.0)
    assert plan_membership(later, dict(first.set)).is_noop
    # a malformed or changed record is overwritten
    changed = plan_membership(
        later, {"a": "not json", "b": json.dumps({"url": "http://x:1", "state": "ready"})}
    )
    assert sorted(changed.set) == ["a", "b"]
