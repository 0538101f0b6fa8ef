"""The planner's memory in the fleet's status: encode, decide when to write, restore (pure functions).

``PlannerMemory`` (cooldowns, quiet period, demand trend) lives in the operator process between
rounds. A restarted or failed-over operator would start with a fresh one and could scale again right
after a scale-up it forgot, so the autoscaler also writes it to ``status.autoscaler.memory`` and an
operator without it in memory restores it from there. Times are the planner's clock (``time.time()``,
epoch seconds) written as RFC 3339 UTC with milliseconds.

Writing every round would patch the API server every ``intervalSeconds`` (``demandTime`` moves each
round), so :func:`memory_due` asks for a write only when a scale happened, a stored quiet period
ended, or the stored copy is older than the refresh period. ``observedTime`` (the
write's time) tells a restarted operator whether the quiet period and the demand trend are still
fresh: if nobody watched the fleet for longer than a few refresh periods they restart, while the
cooldowns (facts about past scaling) are always kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from .autoscale import PlanDecision, PlannerMemory
from .models import PlannerMemoryStatus, ScalingDecisionStatus, describe_validation_error

STATUS_PATH = "status.autoscaler.memory"
MEMORY_REFRESH_S = 30.0  # the stored memory is rewritten at least this often while rounds run
STALE_AFTER_REFRESHES = 3  # older than this many refresh periods: the quiet period restarts
FUTURE_SLACK_S = 5.0  # clock skew between operator hosts tolerated without a warning

# PlannerMemory field -> status field, for the times
_TIMES = {
    "last_scale_up_s": "lastScaleUpTime",
    "last_scale_down_s": "lastScaleDownTime",
    "calm_since_s": "calmSince",
    "demand_s": "demandTime",
}
# a change here is written at once: forgetting a scale would let a restarted operator scale again
_SCALE_FIELDS = ("lastScaleUpTime", "lastScaleDownTime")
WIRE_FIELDS = ("observedTime", *_TIMES.values(), "demand", "demandSlope")


@dataclass(frozen=True, slots=True)
class RestoredMemory:
    memory: PlannerMemory
    observed_s: float | None  # when the stored memory was written (None: not stored)
    warnings: tuple[str, ...] = ()  # malformed fields, each naming its status field
    notes: tuple[str, ...] = ()  # informational: what was restored or deliberately dropped


def refresh_period(interval_s: float) -> float:
    """How often the stored memory is rewritten at least (never more often than a round runs)."""
    return max(MEMORY_REFRESH_S, interval_s)


def format_time(epoch_s: float) -> str:
    """RFC 3339 UTC with milliseconds (what Kubernetes' date-time format accepts)."""
    moment = datetime.fromtimestamp(round(epoch_s, 3), tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:  # a time without an offset is read as UTC, as Kubernetes writes them
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def encode_memory(memory: PlannerMemory, now_s: float) -> dict[str, Any]:
    """The ``status.autoscaler.memory`` object for ``memory`` written at ``now_s``.

    Every field is present: an absent time is ``None``, which a merge patch turns into a removal (a
    quiet period that ended must disappear from the status, not linger)."""
    out: dict[str, Any] = {"observedTime": format_time(now_s)}
    for attr, wire in _TIMES.items():
        value = _finite(getattr(memory, attr))
        out[wire] = format_time(value) if value is not None else None
    demand = _finite(memory.demand)
    out["demand"] = round(max(demand, 0.0), 6) if demand is not None else None
    out["demandSlope"] = round(_finite(memory.demand_slope) or 0.0, 6)
    return out


def memory_due(stored: Mapping[str, Any] | None, encoded: Mapping[str, Any], now_s: float,
               refresh_s: float) -> bool:  # fmt: skip
    """Whether ``encoded`` (this round's memory) must be written over ``stored`` (what the status
    holds, as this operator last wrote it).

    A scale is written at once. So is the end of a stored quiet period: a restarted operator must not
    believe the fleet has been quiet since before it got busy. A quiet period that just began waits
    for the next write (a restart forgetting it only delays a scale-down), so a fleet hovering at the
    edge of quiet does not patch its status every round."""
    if not stored:
        return True
    if any(stored.get(f) != encoded.get(f) for f in _SCALE_FIELDS):
        return True
    if stored.get("calmSince") is not None and stored.get("calmSince") != encoded.get("calmSince"):
        return True
    written = _parse_time(stored.get("observedTime"))
    return written is None or now_s - written >= refresh_s


# The edge of a quiet period: a fleet hovering there flips between these two from round to round. A
# change between them waits for the memory's next write (as the start of a quiet period does in
# memory_due) instead of patching the status every round; any other change is written at once.
_QUIET_EDGE = frozenset({("Hold", None), ("Hold", "ScaleDownStabilizing")})
DecisionKey = tuple[str, str | None]


def decision_key(decision: PlanDecision) -> DecisionKey:
    return (decision.action, decision.limited_by)


def decision_since(previous: DecisionKey | None, since_s: float | None, decision: PlanDecision,
                   acted: bool, now_s: float) -> float:  # fmt: skip
    """When the current decision began: ``since_s`` while its action and limit stay what they were
    (``previous``), ``now_s`` when they change or the plan scales (each scale is news)."""
    if acted or since_s is None or previous != decision_key(decision):
        return now_s
    return since_s


def encode_decision(decision: PlanDecision, reason: str, since_s: float, now_s: float) -> dict[str, Any]:
    """The ``status.autoscaler.decision`` object. ``limitedBy`` is present as None when nothing
    limits the plan, which a merge patch turns into a removal (an old limit must not linger)."""
    return {
        "action": decision.action,
        "limitedBy": decision.limited_by,
        "reason": reason[:1024],
        "since": format_time(since_s),
        "observedTime": format_time(now_s),
    }


def decision_due(stored: Mapping[str, Any] | None, encoded: Mapping[str, Any], acted: bool) -> bool:
    """Whether ``encoded`` (this round's decision) must be written now over ``stored`` (as this
    operator last wrote it); otherwise it goes along with the next status write (the memory's at
    least every refresh period), so a reason whose only change is a counter does not patch the
    status every round."""
    if not stored or acted:
        return True
    old = (stored.get("action"), stored.get("limitedBy"))
    new = (encoded.get("action"), encoded.get("limitedBy"))
    return old != new and not (old in _QUIET_EDGE and new in _QUIET_EDGE)


def decode_decision(status: Mapping[str, Any] | None) -> tuple[DecisionKey, float] | None:
    """The stored decision's action, limit and start (None when absent or malformed): an operator
    restored from the status keeps its ``since`` while the decision stays the same."""
    autoscaler = (status or {}).get("autoscaler") if isinstance(status, Mapping) else None
    raw = autoscaler.get("decision") if isinstance(autoscaler, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    try:
        parsed = ScalingDecisionStatus.model_validate(raw)
    except ValidationError:
        return None  # rewritten by the first round: nothing to warn about, it restores nothing else
    if parsed.since is None:
        return None
    return (parsed.action, parsed.limited_by), _epoch(parsed.since)


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return _epoch(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


def stored_memory(status: Mapping[str, Any] | None) -> Any:
    """``status.autoscaler.memory`` as stored (any type; None when absent)."""
    autoscaler = (status or {}).get("autoscaler") if isinstance(status, Mapping) else None
    return autoscaler.get("memory") if isinstance(autoscaler, Mapping) else None


def observed_time(status: Mapping[str, Any] | None) -> float | None:
    """When the stored memory was written (None when absent or unreadable)."""
    stored = stored_memory(status)
    return _parse_time(stored.get("observedTime")) if isinstance(stored, Mapping) else None


def decode_memory(status: Mapping[str, Any] | None, now_s: float, stale_after_s: float) -> RestoredMemory:
    """The planner memory a fleet's ``status`` holds, for an operator that has none.

    Never raises: a malformed field is dropped with a warning naming it (the others are kept), a
    missing or malformed memory is a fresh one. Times later than ``now_s`` (another host's clock)
    are clamped to ``now_s``. A memory written more than ``stale_after_s`` ago keeps its cooldowns
    but not its quiet period or demand trend: nobody watched the fleet meanwhile."""
    raw = stored_memory(status)
    if raw is None:
        return RestoredMemory(PlannerMemory(), None)
    if not isinstance(raw, Mapping):
        warning = f"{STATUS_PATH}: expected an object, got {type(raw).__name__}; starting with a fresh memory"
        return RestoredMemory(PlannerMemory(), None, (warning,))
    data = dict(raw)
    warnings: list[str] = []
    parsed: PlannerMemoryStatus | None = None
    for _ in range(len(data) + 1):  # each pass drops at least one bad field: bounded
        try:
            parsed = PlannerMemoryStatus.model_validate(data)
            break
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            warnings += [f"{line}; ignored" for line in describe_validation_error(exc, STATUS_PATH)]
            if not bad & set(data):
                break
            data = {k: v for k, v in data.items() if k not in bad}
    if parsed is None:
        return RestoredMemory(
            PlannerMemory(), None, (*warnings, f"{STATUS_PATH}: starting with a fresh memory")
        )

    notes: list[str] = []

    def moment(field: str) -> float | None:
        value = getattr(parsed, field)
        if value is None:
            return None
        epoch = _epoch(value)
        if epoch > now_s:
            if epoch - now_s > FUTURE_SLACK_S:
                wire = PlannerMemoryStatus.model_fields[field].alias or field
                warnings.append(
                    f"{STATUS_PATH}.{wire}: {format_time(epoch)} is {epoch - now_s:.0f}s in the future"
                    " (clock skew?); read as now"
                )
            epoch = now_s
        return epoch

    observed = moment("observed_time")
    memory = PlannerMemory(
        last_scale_up_s=moment("last_scale_up_time"),
        last_scale_down_s=moment("last_scale_down_time"),
        calm_since_s=moment("calm_since"),
        demand=parsed.demand,
        demand_s=moment("demand_time"),
        demand_slope=parsed.demand_slope,
    )
    if memory.demand is None or memory.demand_s is None:
        memory = replace(memory, demand=None, demand_s=None)  # one without the other means nothing
    if observed is None or now_s - observed > stale_after_s:
        age = "of unknown age" if observed is None else f"written {now_s - observed:.0f}s ago"
        if memory.calm_since_s is not None or memory.demand is not None or memory.demand_slope:
            notes.append(
                f"planner memory {age}: keeping cooldowns; the quiet period and demand trend restart"
            )
        memory = replace(memory, calm_since_s=None, demand=None, demand_s=None, demand_slope=0.0)
    return RestoredMemory(memory, observed, tuple(warnings), tuple(notes))
