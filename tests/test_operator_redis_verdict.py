"""A fleet's Redis verdict (RedisAuthFailed, RedisPermissionDenied) outlasts another cause taking Degraded.

Degraded shows one cause at a time. The verdict was kept only there, so when another cause took the
condition while Redis could not be asked (a child the API server refused: ChildRefused; the Secret
with the password gone: RedisUnusable; an invalid spec), the verdict was lost: the fleet looked
fine once that cause passed, and the same refusal was said again, with a second Warning Event, when
Redis answered. Now the verdict has a condition of its own, ``RedisAccessDenied`` (present, True,
only while it holds; reason and message as Degraded's), which no other cause takes: it is what a
round that cannot ask Redis keeps, and what decides whether the verdict's Event was posted.

The rounds run in-process on the emulated API server against a real Valkey/Redis that is stopped
and started again (tests/test_operator_redis_outage.py), here with the API server refusing pods
whose podTemplate mounts a volume they lack (tests/test_operator_refused_children.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import crd_schema, schema_errors
from prefixfleet.operator.planner import (
    REDIS_ACCESS_DENIED,
    REDIS_AUTH_FAILED,
    REDIS_PERMISSION_DENIED,
    FleetRef,
    ObservedState,
    plan_invalid_spec,
    plan_reconcile,
    redis_verdict,
    verdict_event,
)
from tests.test_operator_redis_auth import PASSWORD_REF, password_secret
from tests.test_operator_redis_outage import (  # noqa: F401 (stoppable_redis: a fixture)
    FLEET,
    Operator,
    StoppableRedis,
    in_process_operator,
    stoppable_redis,
)
from tests.test_operator_redis_permissions import ALL_FLEET_KEYS, NAMESPACE, PASSWORD
from tests.test_operator_refused_children import RefusingCluster

# a volumeMount naming no volume of the pod: the API server refuses every replica pod (422)
UNMOUNTABLE = {
    "spec": {"containers": [{"name": "engine", "volumeMounts": [{"name": "models", "mountPath": "/m"}]}]}
}


@pytest.fixture
async def operator(
    tmp_path: Path,
    stoppable_redis: StoppableRedis,  # noqa: F811 (the imported fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Operator]:
    async with in_process_operator(RefusingCluster(tmp_path / "cluster"), stoppable_redis, monkeypatch) as op:
        yield op


def conditions(op: Operator) -> dict[str, dict[str, Any]]:
    got = op.ctx.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {}
    return {c["type"]: c for c in (got.get("status") or {}).get("conditions") or []}


def said(condition: dict[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) of a condition that is True."""
    if condition is None or condition["status"] != "True":
        return None
    return condition["reason"], condition["message"]


def set_pod_template(op: Operator, template: dict[str, Any] | None) -> None:
    op.ctx.kube.request(
        "PATCH",
        op.ctx.kube.path("PrefixCacheFleet", NAMESPACE, FLEET),
        body={"spec": {"engine": {"podTemplate": template}}},
        content_type="application/merge-patch+json",
    )


async def refused_login(op: Operator) -> tuple[str, str]:
    """The fleet's user loses the Secret's password: RedisAuthFailed, one Event."""
    op.redis.user("fleet-a", *ALL_FLEET_KEYS)
    assert await op.round() is None
    op.redis.acl("SETUSER", "fleet-a", "resetpass", ">not-the-secrets-password")
    degraded = said(await op.round())
    assert degraded is not None and degraded[0] == REDIS_AUTH_FAILED, degraded
    assert said(conditions(op).get(REDIS_ACCESS_DENIED)) == degraded
    assert op.warnings(REDIS_AUTH_FAILED) == 1
    return degraded


async def test_a_refused_login_outlasts_a_child_refused_during_an_outage(operator: Operator) -> None:
    verdict = await refused_login(operator)
    operator.redis.stop()
    set_pod_template(operator, UNMOUNTABLE)  # the rolled replica pod is refused
    refused = said(await operator.round())
    assert refused is not None and refused[0] == "ChildRefused", refused
    assert said(conditions(operator).get(REDIS_ACCESS_DENIED)) == verdict
    # the podTemplate fixed, Redis still down: the kept verdict is the fleet's cause again
    set_pod_template(operator, None)
    assert said(await operator.round()) == verdict  # before: None, the verdict lost to ChildRefused
    # Redis back without the user (no saved ACL): refused alike, and not announced again
    operator.redis.start()
    assert said(await operator.round()) == verdict
    assert operator.warnings(REDIS_AUTH_FAILED) == 1  # before: 2
    # the user back with the Secret's password: both clear
    operator.redis.user("fleet-a", *ALL_FLEET_KEYS)
    assert await operator.round() is None
    assert REDIS_ACCESS_DENIED not in conditions(operator)
    assert operator.warnings(REDIS_AUTH_FAILED) == 1


async def test_a_refused_login_outlasts_its_password_secret_gone_missing(operator: Operator) -> None:
    verdict = await refused_login(operator)
    operator.ctx.kube.delete("Secret", NAMESPACE, PASSWORD_REF["name"])
    unusable = said(await operator.round())
    assert unusable is not None and unusable[0] == "RedisUnusable", unusable
    # the password could not be read, so Redis was not asked: the verdict stands
    assert said(conditions(operator).get(REDIS_ACCESS_DENIED)) == verdict  # before: cleared
    operator.cluster.apply(password_secret(PASSWORD))
    assert said(await operator.round()) == verdict
    assert operator.warnings(REDIS_AUTH_FAILED) == 1  # before: 2


# ------------------------------------------------------------------ the decision (pure)

AUTH = {"type": REDIS_ACCESS_DENIED, "status": "True", "reason": REDIS_AUTH_FAILED, "message": "refused"}
DENIED = {
    "type": REDIS_ACCESS_DENIED,
    "status": "True",
    "reason": REDIS_PERMISSION_DENIED,
    "message": "denied",
}


def degraded(reason: str) -> dict[str, str]:
    return {"type": "Degraded", "status": "True", "reason": reason, "message": "another cause"}


@pytest.mark.parametrize("other", ["ChildRefused", "RedisUnusable", "InvalidSpec", "ReplicaFailed"])
def test_a_round_that_could_not_ask_keeps_the_verdict_whatever_degraded_shows(other: str) -> None:
    assert redis_verdict(None, "", [degraded(other), AUTH]) == ("refused", "")
    assert redis_verdict(None, None, [degraded(other), DENIED]) == ("", "denied")
    assert redis_verdict("", None, [degraded(other), DENIED]) == ("", "denied")
    # no Event for a verdict the fleet already holds; one for a new or changed one
    assert verdict_event(REDIS_AUTH_FAILED, "refused", [degraded(other), AUTH]) == []
    assert [e.reason for e in verdict_event(REDIS_AUTH_FAILED, "other", [degraded(other), AUTH])] == [
        REDIS_AUTH_FAILED
    ]
    assert [e.reason for e in verdict_event(REDIS_AUTH_FAILED, "refused", [degraded(other), DENIED])] == [
        REDIS_AUTH_FAILED
    ]
    # a round that reached Redis decides alone
    assert redis_verdict("", "", [degraded(other), AUTH]) == ("", "")


def test_a_status_written_before_the_verdict_condition_still_holds_it_in_degraded() -> None:
    # an operator upgraded while its fleet is refused: the verdict is in Degraded only
    old = {"type": "Degraded", "status": "True", "reason": REDIS_AUTH_FAILED, "message": "refused"}
    assert redis_verdict(None, "", [old]) == ("refused", "")
    assert verdict_event(REDIS_AUTH_FAILED, "refused", [old]) == []


REF = FleetRef(name=FLEET, namespace=NAMESPACE, generation=2)
SPEC = models.validate_spec({"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 0})


def test_an_invalid_spec_keeps_the_verdict_condition_as_it_was() -> None:
    kept = {**AUTH, "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}
    status = plan_invalid_spec(REF, ["spec.x: wrong"], ObservedState(conditions=[degraded("X"), kept]))
    found = {c["type"]: c for c in status["conditions"]}
    assert found["Degraded"]["reason"] == "InvalidSpec"
    assert found[REDIS_ACCESS_DENIED] == kept


def test_an_invalid_spec_keeps_a_verdict_an_older_operator_kept_in_degraded() -> None:
    # An operator upgraded while its fleet is refused, whose first round finds the spec invalid (the
    # new models may refuse what the old ones took): the verdict is in Degraded only, which
    # InvalidSpec takes. Before, it was lost there: the fleet looked fine once the spec was fixed
    # while Redis was down, and Redis answering the same refusal posted a second Warning Event.
    old = {**degraded(REDIS_AUTH_FAILED), "message": "refused", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    status = plan_invalid_spec(REF, ["spec.x: wrong"], ObservedState(conditions=[old]))
    found = {c["type"]: c for c in status["conditions"]}
    assert found["Degraded"]["reason"] == "InvalidSpec"
    assert said(found.get(REDIS_ACCESS_DENIED)) == (REDIS_AUTH_FAILED, "refused")
    # the spec fixed, Redis not answering: still the verdict, and no second Event
    assert redis_verdict(None, "", status["conditions"]) == ("refused", "")
    assert verdict_event(REDIS_AUTH_FAILED, "refused", status["conditions"]) == []
    # nothing held: nothing carried
    plain = plan_invalid_spec(REF, ["spec.x: wrong"], ObservedState(conditions=[degraded("ReplicaFailed")]))
    assert REDIS_ACCESS_DENIED not in {c["type"] for c in plain["conditions"]}


def test_the_planned_conditions_are_ones_the_crds_status_schema_takes() -> None:
    # An API server checks a status update against the CRD: a condition type outside its enum is a
    # 422 for the whole update. RedisPasswordExposed was outside it before (the emulated API server
    # does not check status, so no test saw it).
    plan = plan_reconcile(
        REF,
        SPEC,
        ObservedState(
            redis_url="redis://r:6379/0", redis_auth_problem="refused", redis_password_warning="exposed"
        ),
    )
    types = [c["type"] for c in plan.status["conditions"]]
    assert types == ["Ready", "Progressing", "Degraded", "RedisPasswordExposed", REDIS_ACCESS_DENIED]
    status_schema = crd_schema(build_crd())["properties"]["status"]
    assert schema_errors(status_schema, plan.status) == []
    assert models.FleetStatus.model_validate(plan.status).condition(REDIS_ACCESS_DENIED) is not None
