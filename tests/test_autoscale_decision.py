"""The autoscaler's current decision in the fleet's status (pure functions, plain data).

Specification: ``classify_plan`` names what a plan does (ScaleUp, ScaleDown, Prewarm, Hold) and what
held it back (TooManyReplicas at maxReplicas, TooFewReplicas at minReplicas, ScaleDownStabilizing
while a quiet period runs, ScaleUpDeferred, TooFewReadyReplicas, ColdStart), for plans plan_scale
itself makes (so a reworded reason fails here); ``decision_due`` writes a change of action or limit
at once, and a reason whose only change is a counter ("quiet for 37s" -> "47s") not at all (it goes
along with the memory's next write), nor a flip at the edge of a quiet period.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefixfleet.operator.autoscale import (
    FleetObservation,
    PlanDecision,
    PlannerMemory,
    ReplicaObservation,
    ScalePlan,
    ScalePolicy,
    SubtreeObservation,
    classify_plan,
    plan_scale,
)
from prefixfleet.operator.autoscale_memory import (
    decision_due,
    decision_since,
    decode_decision,
    encode_decision,
    format_time,
)
from prefixfleet.operator.autoscale_observe import with_unavailable
from prefixfleet.operator.models import ScalingDecisionStatus

NOW = 1000.0
BUSY_WAIT_S = 5.0  # past saturation (0.7 × the 1 s target)


def ready(name: str, wait_s: float = 0.0, load: float = 0.0) -> ReplicaObservation:
    return ReplicaObservation(name, "ready", est_wait_s=wait_s, prefill_load=load, created_s=0.0)


def plan(replicas: list[ReplicaObservation], memory: PlannerMemory | None = None,
         subtrees: tuple[SubtreeObservation, ...] = (), **knobs: object) -> ScalePlan:  # fmt: skip
    policy = ScalePolicy(**{"min_replicas": 1, "max_replicas": 3, "target_ttft_s": 1.0,
                            "lead_time_s": 0.0, "scale_down_stabilization_s": 300.0, **knobs})  # fmt: skip
    return plan_scale(FleetObservation(NOW, tuple(replicas), subtrees), policy, memory)


HOT_ON_R0 = SubtreeObservation("s", 2000, 5.0, frozenset({"r0"}))
BUSY3 = [ready(f"r{i}", BUSY_WAIT_S) for i in range(3)]
IDLE2 = [ready("r0"), ready("r1")]

CASES = {
    "saturated at maxReplicas": (plan(BUSY3), "saturated, at maxReplicas", "Hold", "TooManyReplicas"),
    "above maxReplicas": (plan(BUSY3, max_replicas=2), "above maxReplicas", "ScaleDown", "TooManyReplicas"),
    "quiet at minReplicas": (plan([ready("r0")]), "quiet, at minReplicas", "Hold", "TooFewReplicas"),
    "below minReplicas": (
        plan([ready("r0")], min_replicas=2), "below minReplicas", "ScaleUp", "TooFewReplicas"
    ),
    "quiet, stabilizing": (
        plan(IDLE2, PlannerMemory(calm_since_s=NOW - 37)), "quiet for 37s", "Hold", "ScaleDownStabilizing"
    ),
    "saturated, replicas on their way": (
        plan([*BUSY3[:2], ReplicaObservation("new", "starting", created_s=NOW)], max_replicas=4),
        "saturated, waiting", "Hold", "ScaleUpDeferred",
    ),
    "quiet, one ready": (  # (uniform: the prefix-aware planner is not quiet while one is starting)
        plan([ready("r0"), ReplicaObservation("r1", "starting")], PlannerMemory(calm_since_s=0.0),
             mode="uniform"),
        "quiet, but only one replica is ready", "Hold", "TooFewReadyReplicas",
    ),
    "cold start": (
        plan([ReplicaObservation("r0", "ready", prefill_load=2.0, created_s=NOW - 1)], lead_time_s=60.0),
        "prefill load", "Hold", "ColdStart",
    ),
    "scale up": (plan(BUSY3[:2]), "scale up by 1", "ScaleUp", None),
    "scale down": (
        plan(IDLE2, PlannerMemory(calm_since_s=0.0)), "scale down:", "ScaleDown", None
    ),
    "steady": (plan([ready("r0", 0.5), ready("r1", 0.5)]), "steady", "Hold", None),
    "pre-warm": (
        plan([ready("r0", BUSY_WAIT_S), ready("r1")], subtrees=(HOT_ON_R0,)),
        "replicate 1 hot subtree", "Prewarm", None,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_plans_of_the_planner_are_classified(case: str) -> None:
    made, reason_start, action, limit = CASES[case]
    assert made.reason.startswith(reason_start), made  # the planner still says what this case is about
    assert classify_plan(made) == PlanDecision(action, limit)  # type: ignore[arg-type]


def test_unavailable_replicas_appended_to_a_reason_keep_its_limit() -> None:
    made = with_unavailable(CASES["saturated at maxReplicas"][0], ["r9"])
    assert "r9" in made.reason
    assert classify_plan(made) == PlanDecision("Hold", "TooManyReplicas")


def test_removing_drained_pods_alone_is_no_action() -> None:
    assert classify_plan(ScalePlan(desired_replicas=2, remove=("r3",))) == PlanDecision("Hold", None)


def encoded(action: str, limit: str | None, reason: str = "", since: float = NOW, now: float = NOW) -> dict:
    return encode_decision(PlanDecision(action, limit), reason, since, now)  # type: ignore[arg-type]


def stored(decision: dict) -> dict:
    return {k: v for k, v in decision.items() if v is not None}  # what the merge patch leaves


def test_a_counter_in_the_reason_is_not_worth_a_write() -> None:
    before = stored(encoded("Hold", "ScaleDownStabilizing", "quiet for 37s"))
    after = encoded("Hold", "ScaleDownStabilizing", "quiet for 47s", now=NOW + 10)
    assert not decision_due(before, after, acted=False)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (("Hold", "ScaleDownStabilizing"), ("Hold", "TooFewReplicas")),  # the quiet period ended at min
        (("Hold", None), ("Hold", "TooManyReplicas")),  # saturated at max
        (("Hold", "TooManyReplicas"), ("Hold", None)),  # no longer limited
        (("Hold", "ScaleUpDeferred"), ("ScaleUp", None)),
    ],
)
def test_a_new_action_or_limit_is_written_at_once(old: tuple, new: tuple) -> None:
    assert decision_due(stored(encoded(*old)), encoded(*new), acted=False)


def test_the_edge_of_a_quiet_period_waits_for_the_next_write() -> None:
    steady, quiet = encoded("Hold", None, "steady"), encoded("Hold", "ScaleDownStabilizing", "quiet for 0s")
    assert not decision_due(stored(steady), quiet, acted=False)
    assert not decision_due(stored(quiet), steady, acted=False)


def test_nothing_stored_or_a_scale_is_written_at_once() -> None:
    assert decision_due(None, encoded("Hold", None), acted=False)
    up = encoded("ScaleUp", None, "scale up by 1: ...")
    assert decision_due(stored(up), encoded("ScaleUp", None, "scale up by 2: ..."), acted=True)


def test_since_is_kept_while_the_decision_lasts_and_moves_when_it_changes_or_scales() -> None:
    quiet = PlanDecision("Hold", "ScaleDownStabilizing")
    key = ("Hold", "ScaleDownStabilizing")
    assert decision_since(key, 900.0, quiet, acted=False, now_s=NOW) == 900.0
    assert decision_since(("Hold", None), 900.0, quiet, acted=False, now_s=NOW) == NOW
    assert decision_since(None, None, quiet, acted=False, now_s=NOW) == NOW
    up = PlanDecision("ScaleUp", None)
    assert decision_since(("ScaleUp", None), 900.0, up, acted=True, now_s=NOW) == NOW


def test_the_encoded_decision_is_what_the_status_model_accepts_and_decodes_back() -> None:
    body = stored(encoded("Hold", "TooManyReplicas", "saturated, at maxReplicas", since=990.0))
    parsed = ScalingDecisionStatus.model_validate(body)
    assert (parsed.action, parsed.limited_by, parsed.reason) == ("Hold", "TooManyReplicas", body["reason"])
    assert decode_decision({"autoscaler": {"decision": body}}) == (("Hold", "TooManyReplicas"), 990.0)
    assert encoded("Hold", None, "x" * 5000)["reason"] == "x" * 1024  # the schema's maxLength


def test_an_unknown_limit_is_refused_by_the_model_and_not_restored() -> None:
    body = {"action": "Hold", "limitedBy": "Bored", "since": format_time(NOW)}
    with pytest.raises(ValidationError, match=r"limitedBy|limited_by"):
        ScalingDecisionStatus.model_validate(body)
    assert decode_decision({"autoscaler": {"decision": body}}) is None
    assert decode_decision({"autoscaler": {"decision": "Hold"}}) is None
    assert decode_decision({}) is None
