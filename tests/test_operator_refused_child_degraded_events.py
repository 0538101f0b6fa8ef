"""While a refused child takes the Degraded condition, the planner's own Degraded Event is not repeated.

``Degraded`` shows one cause at a time; a child the API server refuses (ChildRefused,
operator/refusals.py) overrides the planner's. ``RedisUnusable`` posts its Warning Event when
Degraded turns to it, by comparing with the Degraded condition the fleet shows
(``planner.degraded_event``). While a child was refused, the fleet showed ChildRefused, so that
comparison never matched and the planner's Event was posted again every 10 s round. Now a round
whose Degraded a refused child took posts none (``events_carried_out(..., degraded_taken=True)``);
the Event comes when Degraded turns to that cause, once the refusal is gone.

``RedisCommandsRefused`` had the same fault (a read-only Redis plus a webhook refusing the gateway
Deployment: its Warning every round). Its verdict now has a condition of its own, which its Event
follows (``planner.refused_event``): posted once when the refusal starts, whatever Degraded shows,
and not again when Degraded turns back to it (tests/test_operator_redis_refusals_kept.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import (
    REDIS_COMMANDS_REFUSED,
    REDIS_UNUSABLE,
    ObservedState,
    events_carried_out,
    plan_reconcile,
)
from tests.k8s.cluster import emulator_fleet
from tests.test_operator_redis_refusals import FLEET, NAMESPACE, REF, SPEC, FakeRedis, fake_redis

# the fixtures: the emulated API server behind the gateway webhook (server, kube), an operator's
# context on it (ctx)
from tests.test_operator_redis_refusals_outage import ctx  # noqa: F401
from tests.test_operator_router_refused import DENIAL, GatewayWebhookApiServer, kube, server  # noqa: F401

CHILD_REFUSED = {
    "type": "Degraded",
    "status": "True",
    "reason": "ChildRefused",
    "message": f"the API server refused Deployment {NAMESPACE}/{FLEET}-router (400 BadRequest): {DENIAL}",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
    "observedGeneration": 1,
}

# ------------------------------------------------------------------ the plan (plain data)


def test_the_plans_degraded_event_goes_while_a_refused_child_takes_degraded() -> None:
    observed = ObservedState(redis_problem="spec.redis.secretRef: Secret s not found")
    plan = plan_reconcile(REF, SPEC, replace(observed, conditions=[CHILD_REFUSED]))
    # the plan alone cannot tell: the fleet shows ChildRefused, not its cause, every round
    assert REDIS_UNUSABLE in [e.reason for e in plan.events]
    everything = [c.key for c in plan.children]
    assert REDIS_UNUSABLE not in [e.reason for e in events_carried_out(plan, everything, degraded_taken=True)]
    assert events_carried_out(plan, everything) == plan.events  # nothing refused: as planned


def test_a_redis_refusal_is_said_once_whatever_degraded_shows() -> None:
    observed = ObservedState(redis_url="redis://r/0", redis_refused="refused: READONLY")
    plan = plan_reconcile(REF, SPEC, replace(observed, conditions=[CHILD_REFUSED]))
    everything = [c.key for c in plan.children]
    # a new refusal: said even though a refused child holds Degraded, in its own condition
    assert REDIS_COMMANDS_REFUSED in [e.reason for e in events_carried_out(plan, everything, True)]
    kept = [c for c in plan.status["conditions"] if c["type"] == REDIS_COMMANDS_REFUSED]
    # the next rounds: that condition says it already
    again = plan_reconcile(REF, SPEC, replace(observed, conditions=[CHILD_REFUSED, *kept]))
    assert REDIS_COMMANDS_REFUSED not in [e.reason for e in again.events]


# ------------------------------------------------------------------ the round, as the operator runs it


@pytest.fixture
def read_only() -> Iterator[FakeRedis]:
    with fake_redis(refuse={"HSET": "READONLY You can't write against a read only replica."}) as fake:
        yield fake


def warnings(context: OperatorContext) -> list[str]:
    """One reconcile round as the operator runs it: the reasons of its Warning Events."""
    outcome = reconcile_in_cluster(context, NAMESPACE, FLEET)
    assert outcome is not None
    return [e.reason for e in outcome.events if e.type == "Warning"]


def test_a_refused_gateway_update_on_a_read_only_redis_posts_each_warning_once(
    ctx: OperatorContext,  # noqa: F811
    server: GatewayWebhookApiServer,  # noqa: F811
    read_only: FakeRedis,
) -> None:
    fleet = emulator_fleet(FLEET, NAMESPACE, {"url": read_only.url()}, replicas=0, routers=1)
    ctx.kube.request("POST", Kube.path("PrefixCacheFleet", NAMESPACE), body=json.loads(fleet))
    assert warnings(ctx) == [REDIS_COMMANDS_REFUSED]
    ctx.kube.merge_patch("PrefixCacheFleet", NAMESPACE, FLEET, {"spec": {"router": {"replicas": 2}}})
    assert warnings(ctx) == ["ChildRefused"]
    # the fleet shows ChildRefused now: before, RedisCommandsRefused again in each of these rounds
    assert warnings(ctx) == [] and warnings(ctx) == []
    # the update taken: Degraded turns back to the Redis refusal, said already (its own condition
    # kept it meanwhile; before, its Event came a second time now)
    server.refusing = False
    assert warnings(ctx) == []
    assert warnings(ctx) == []
