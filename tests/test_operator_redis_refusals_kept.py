"""RedisCommandsRefused outlasts another cause taking the fleet's Degraded condition.

A fleet whose Redis refuses its commands for a reason about neither the credentials nor the ACL (a
read-only replica, out of memory, a failed snapshot) is Degraded=True, reason RedisCommandsRefused
(tests/test_operator_redis_refusals.py). ``Degraded`` shows one cause at a time, and a child the API
server refuses (ChildRefused) takes it over. Before, that verdict lived only in ``Degraded``: while
a refused child held it, ``kubectl describe pcf`` showed nothing of the Redis refusal, a round in
which Redis did not answer forgot it (nothing left to keep), so once the child was taken the fleet
said ``AsExpected: no failures observed`` although Redis still refused every write, and when Redis
answered the same refusal again its Warning Event came a second time; a refusal that started while
the child was refused was not announced until the child was taken. Now the verdict has a condition of
its own, ``RedisCommandsRefused=True`` (present only while it holds), as RedisAccessDenied keeps the
credentials' verdict: it is shown whatever Degraded shows, kept through rounds Redis does not answer,
``Degraded`` turns back to it once the other cause passes, and its one Warning Event comes when the
refusal starts or changes, not again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import CONDITION_TYPES
from prefixfleet.operator.planner import (
    REDIS_AUTH_FAILED,
    REDIS_COMMANDS_REFUSED,
    REDIS_REFUSING,
    ObservedState,
    plan_invalid_spec,
)
from tests.k8s.cluster import emulator_fleet
from tests.test_operator_redis_refusals import FLEET, NAMESPACE, REF
from tests.test_operator_redis_refusals_outage import READONLY, FlakyRedis, ctx, flaky  # noqa: F401
from tests.test_operator_router_refused import GatewayWebhookApiServer, kube, server  # noqa: F401

# (the fixtures: the emulated API server behind the gateway webhook, server and kube; an operator's
# context on it, ctx; a fake Redis refusing HSET as a read-only replica, which can drop the link, flaky)


# ------------------------------------------------------------------ an invalid spec (plain data)


def test_an_invalid_spec_keeps_the_refusal_verdict() -> None:
    refusing = {
        "type": REDIS_REFUSING,
        "status": "True",
        "reason": REDIS_COMMANDS_REFUSED,
        "message": f"the fleet's Redis refuses commands the fleet runs ...: {READONLY}",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 1,
    }
    # Redis is not asked while the spec is invalid: the verdict stands as it was
    status = plan_invalid_spec(REF, ["spec.replicas: bad"], ObservedState(conditions=[refusing]))
    assert refusing in status["conditions"]
    # a fleet whose status an older operator wrote has it in Degraded: InvalidSpec takes that, so
    # the verdict moves to its own condition
    older = dict(refusing, type="Degraded")
    status = plan_invalid_spec(REF, ["spec.replicas: bad"], ObservedState(conditions=[older]))
    kept = {c["type"]: c for c in status["conditions"]}
    assert kept["Degraded"]["reason"] == "InvalidSpec"
    assert (kept[REDIS_REFUSING]["reason"], kept[REDIS_REFUSING]["message"]) == (
        REDIS_COMMANDS_REFUSED,
        refusing["message"],
    )


# ------------------------------------------------------------------ the round, as the operator runs it


def round_said(context: OperatorContext) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """One reconcile round as the operator runs it: its Warning Events' reasons, and the fleet's
    conditions after it by type (what ``kubectl describe pcf`` shows)."""
    outcome = reconcile_in_cluster(context, NAMESPACE, FLEET)
    assert outcome is not None
    fleet = context.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {}
    conditions = {c["type"]: c for c in fleet["status"]["conditions"]}
    # the CRD's enum: a real API server refuses the whole status update naming another type
    assert set(conditions) <= set(CONDITION_TYPES), conditions
    return [e.reason for e in outcome.events if e.type == "Warning"], conditions


def shown(conditions: dict[str, dict[str, Any]], type_: str) -> tuple[str, str, str] | None:
    c = conditions.get(type_)
    return None if c is None else (c["status"], c["reason"], c["message"])


def create_fleet(context: OperatorContext, fake: FlakyRedis) -> None:
    fleet = emulator_fleet(FLEET, NAMESPACE, {"url": fake.url()}, replicas=0, routers=1)
    context.kube.request("POST", Kube.path("PrefixCacheFleet", NAMESPACE), body=json.loads(fleet))


def refuse_the_gateway_update(context: OperatorContext) -> None:
    """Two gateway replicas: the webhook (while ``refusing``) refuses the Deployment's update."""
    context.kube.merge_patch("PrefixCacheFleet", NAMESPACE, FLEET, {"spec": {"router": {"replicas": 2}}})


@dataclass(frozen=True)
class Scene:
    """An operator's context on the emulated API server behind the gateway webhook (``server``),
    and the fake Redis of the fleet (``flaky``)."""

    ctx: OperatorContext
    server: GatewayWebhookApiServer
    flaky: FlakyRedis


@pytest.fixture
def scene(ctx: OperatorContext, server: GatewayWebhookApiServer, flaky: FlakyRedis) -> Scene:  # noqa: F811
    return Scene(ctx, server, flaky)


def test_a_refusal_outlasts_a_refused_child_and_an_outage(scene: Scene) -> None:
    create_fleet(scene.ctx, scene.flaky)
    said, first = round_said(scene.ctx)
    refusal = shown(first, "Degraded")
    assert said == [REDIS_COMMANDS_REFUSED] and refusal is not None and READONLY in refusal[2]
    assert refusal[1] == REDIS_COMMANDS_REFUSED
    assert shown(first, REDIS_COMMANDS_REFUSED) == refusal

    # a refused child takes Degraded: the Redis refusal is still shown (before: nowhere)
    refuse_the_gateway_update(scene.ctx)
    said, conditions = round_said(scene.ctx)
    assert said == ["ChildRefused"] and shown(conditions, "Degraded")[1] == "ChildRefused"  # type: ignore[index]
    assert shown(conditions, REDIS_COMMANDS_REFUSED) == refusal

    # Redis stops answering mid-check: the round decides nothing, the verdict stands (before: forgotten)
    scene.flaky.close_on = "MULTI"
    said, conditions = round_said(scene.ctx)
    assert said == [] and shown(conditions, REDIS_COMMANDS_REFUSED) == refusal

    # the update taken while Redis still does not answer: Degraded turns back to the Redis refusal
    # (before: AsExpected, "no failures observed"), with no second Event
    scene.server.refusing = False
    said, conditions = round_said(scene.ctx)
    assert said == [] and shown(conditions, "Degraded") == refusal
    assert conditions["Degraded"]["lastTransitionTime"] == first["Degraded"]["lastTransitionTime"]

    # Redis answers the same refusal again: nothing new (before: its Warning Event a second time)
    scene.flaky.close_on = ""
    said, conditions = round_said(scene.ctx)
    assert said == [] and shown(conditions, "Degraded") == refusal

    # Redis takes the writes again: both clear
    scene.flaky.refuse = {}
    said, conditions = round_said(scene.ctx)
    assert said == [] and shown(conditions, "Degraded")[:2] == ("False", "AsExpected")  # type: ignore[index]
    assert REDIS_COMMANDS_REFUSED not in conditions


def test_a_refusal_starting_while_a_child_is_refused_is_said_when_it_starts(scene: Scene) -> None:
    scene.flaky.refuse = {}
    create_fleet(scene.ctx, scene.flaky)
    assert round_said(scene.ctx)[0] == []
    refuse_the_gateway_update(scene.ctx)
    assert round_said(scene.ctx)[0] == ["ChildRefused"]

    # Redis turns read-only while the child is refused: said now (before: only once the child was taken)
    scene.flaky.refuse = {"HSET": READONLY}
    said, conditions = round_said(scene.ctx)
    refusal = shown(conditions, REDIS_COMMANDS_REFUSED)
    assert said == [REDIS_COMMANDS_REFUSED] and refusal is not None and READONLY in refusal[2]
    assert shown(conditions, "Degraded")[1] == "ChildRefused"  # type: ignore[index]
    assert round_said(scene.ctx)[0] == []

    # the child taken: Degraded shows the refusal, already announced (before: its Event came now)
    scene.server.refusing = False
    said, conditions = round_said(scene.ctx)
    assert said == [] and shown(conditions, "Degraded") == refusal


def test_a_refused_login_ends_the_refusal_verdict(scene: Scene) -> None:
    create_fleet(scene.ctx, scene.flaky)
    assert round_said(scene.ctx)[0] == [REDIS_COMMANDS_REFUSED]
    # a password set on that Redis: the fleet's calls now get the refusal of its credentials, which
    # Degraded says; the read-only verdict is not kept behind it (nothing of it is known any more)
    scene.flaky.password = "set-later"
    said, conditions = round_said(scene.ctx)
    assert said == [REDIS_AUTH_FAILED] and shown(conditions, "Degraded")[1] == REDIS_AUTH_FAILED  # type: ignore[index]
    assert REDIS_COMMANDS_REFUSED not in conditions
