"""The planner's memory in status.autoscaler.memory: encoded, decided when to write, restored.

Specification:
* encode -> decode gives back the memory (times to the millisecond); the encoded object validates
  against the CRD's status schema;
* a malformed field is dropped with a warning naming it (the others survive); a malformed or absent
  memory is a fresh one; decoding never raises;
* a memory nobody refreshed for longer than the stale horizon keeps its cooldowns but not its quiet
  period or demand trend; times in the future (another host's clock) are read as now;
* a write is due when a decision time changes or the stored copy is older than the refresh period,
  not because the demand sample moved;
* a restored memory keeps the planner from scaling up inside the cooldown it remembers.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.operator.autoscale import (
    FleetObservation,
    PlannerMemory,
    ReplicaObservation,
    ScalePolicy,
    plan_scale,
)
from prefixfleet.operator.autoscale_memory import (
    MEMORY_REFRESH_S,
    decode_memory,
    encode_memory,
    format_time,
    memory_due,
    refresh_period,
)
from prefixfleet.operator.crd import build_crd

NOW = 1_796_000_000.0  # 2026-11-30, the planner's clock: time.time()
STALE = 90.0


def status_of(memory: Any) -> dict[str, Any]:
    return {"autoscaler": {"memory": memory}}


def stored(encoded: dict[str, Any]) -> dict[str, Any]:
    """What a merge patch of ``encoded`` leaves in the API server (nulls remove keys)."""
    return {k: v for k, v in encoded.items() if v is not None}


FULL = PlannerMemory(
    last_scale_up_s=NOW - 12.3456,
    last_scale_down_s=NOW - 600.5,
    calm_since_s=NOW - 40.25,
    demand=1.75,
    demand_s=NOW - 1.0,
    demand_slope=-0.0125,
)


def test_round_trip_keeps_every_field_to_the_millisecond() -> None:
    restored = decode_memory(status_of(stored(encode_memory(FULL, NOW))), NOW + 2, STALE)
    assert restored.warnings == () and restored.notes == ()
    assert restored.observed_s == NOW
    m = restored.memory
    for attr in ("last_scale_up_s", "last_scale_down_s", "calm_since_s", "demand_s"):
        assert getattr(m, attr) == pytest.approx(getattr(FULL, attr), abs=0.0005), attr
    assert (m.demand, m.demand_slope) == (FULL.demand, FULL.demand_slope)


def test_encoded_times_are_rfc3339_utc_and_absent_ones_are_nulls_for_the_merge_patch() -> None:
    encoded = encode_memory(PlannerMemory(last_scale_up_s=NOW), NOW + 0.5)
    assert encoded == {
        "observedTime": "2026-11-30T00:53:20.500Z",
        "lastScaleUpTime": "2026-11-30T00:53:20.000Z",
        "lastScaleDownTime": None,
        "calmSince": None,
        "demand": None,
        "demandTime": None,
        "demandSlope": 0.0,
    }
    assert format_time(NOW + 0.0004) == "2026-11-30T00:53:20.000Z"


@given(
    up=st.none() | st.floats(NOW - 10_000, NOW),
    calm=st.none() | st.floats(NOW - 10_000, NOW),
    demand=st.none() | st.floats(0, 1000),
    slope=st.floats(-100, 100),
)
def test_any_memory_round_trips_and_matches_the_crd_schema(
    up: float | None, calm: float | None, demand: float | None, slope: float
) -> None:
    memory = PlannerMemory(
        last_scale_up_s=up, calm_since_s=calm, demand=demand, demand_s=None if demand is None else NOW,
        demand_slope=slope,
    )  # fmt: skip
    encoded = stored(encode_memory(memory, NOW))
    jsonschema.validate(status_of(encoded), STATUS_SCHEMA)
    restored = decode_memory(status_of(encoded), NOW, STALE)
    assert restored.warnings == ()
    got = restored.memory
    assert (got.last_scale_up_s is None) == (up is None) and (got.calm_since_s is None) == (calm is None)
    if up is not None:
        assert got.last_scale_up_s == pytest.approx(up, abs=0.0005)
    if demand is not None:
        assert got.demand == pytest.approx(demand, abs=1e-6)
    assert got.demand_slope == pytest.approx(slope, abs=1e-6)


STATUS_SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


@pytest.mark.parametrize("status", [None, {}, {"autoscaler": None}, {"autoscaler": {}}, status_of(None)])
def test_no_stored_memory_is_a_fresh_one_without_warnings(status: Any) -> None:
    restored = decode_memory(status, NOW, STALE)
    assert restored.memory == PlannerMemory() and restored.observed_s is None and restored.warnings == ()


@pytest.mark.parametrize("memory", ["garbage", 42, ["lastScaleUpTime"]])
def test_a_memory_that_is_not_an_object_is_a_fresh_one_with_a_warning(memory: Any) -> None:
    restored = decode_memory(status_of(memory), NOW, STALE)
    assert restored.memory == PlannerMemory()
    (warning,) = restored.warnings
    assert "status.autoscaler.memory: expected an object" in warning


def test_a_malformed_field_is_dropped_with_a_warning_naming_it_and_the_others_survive() -> None:
    good = stored(encode_memory(FULL, NOW))
    bad = {**good, "calmSince": "yesterday-ish", "demandSlope": "steep", "color": "blue"}
    restored = decode_memory(status_of(bad), NOW, STALE)
    text = "\n".join(restored.warnings)
    assert "status.autoscaler.memory.calmSince" in text
    assert "status.autoscaler.memory.demandSlope" in text
    assert "status.autoscaler.memory.color" in text
    assert len(restored.warnings) == 3
    m = restored.memory
    assert m.calm_since_s is None and m.demand_slope == 0.0
    assert m.last_scale_up_s == pytest.approx(FULL.last_scale_up_s, abs=0.0005)
    assert m.demand == FULL.demand


@pytest.mark.parametrize(
    ("field", "value"),
    [("demand", -1), ("demand", "NaN"), ("lastScaleUpTime", 12.5e99), ("lastScaleUpTime", {"at": 1}),
     ("observedTime", "2026-13-45T99:00:00Z"), ("demandSlope", None)],
)  # fmt: skip
def test_nonsense_values_never_raise(field: str, value: Any) -> None:
    restored = decode_memory(status_of({**stored(encode_memory(FULL, NOW)), field: value}), NOW, STALE)
    assert isinstance(restored.memory, PlannerMemory)
    assert any(f"status.autoscaler.memory.{field}" in w for w in restored.warnings), restored.warnings


def test_demand_without_its_time_is_dropped() -> None:
    encoded = stored(encode_memory(FULL, NOW))
    del encoded["demandTime"]
    m = decode_memory(status_of(encoded), NOW, STALE).memory
    assert m.demand is None and m.demand_s is None


def test_a_stale_memory_keeps_cooldowns_but_restarts_the_quiet_period_and_trend() -> None:
    written = NOW - STALE - 1
    restored = decode_memory(status_of(stored(encode_memory(FULL, written))), NOW, STALE)
    m = restored.memory
    assert m.last_scale_up_s == pytest.approx(FULL.last_scale_up_s, abs=0.0005)
    assert m.last_scale_down_s == pytest.approx(FULL.last_scale_down_s, abs=0.0005)
    assert (m.calm_since_s, m.demand, m.demand_s, m.demand_slope) == (None, None, None, 0.0)
    assert restored.warnings == () and "quiet period" in restored.notes[0]


def test_a_memory_without_observed_time_counts_as_stale() -> None:
    encoded = stored(encode_memory(FULL, NOW))
    del encoded["observedTime"]
    m = decode_memory(status_of(encoded), NOW, STALE).memory
    assert m.calm_since_s is None and m.last_scale_up_s is not None


def test_future_times_are_read_as_now_with_a_warning_beyond_small_skew() -> None:
    ahead = PlannerMemory(last_scale_up_s=NOW + 3600, last_scale_down_s=NOW + 2)
    restored = decode_memory(status_of(stored(encode_memory(ahead, NOW))), NOW, STALE)
    assert restored.memory.last_scale_up_s == NOW and restored.memory.last_scale_down_s == NOW
    assert len(restored.warnings) == 1 and "lastScaleUpTime" in restored.warnings[0]


# ------------------------------------------------------------------ when to write


def test_a_write_is_due_for_a_scale_an_ended_quiet_period_or_an_old_copy_not_for_a_moved_sample() -> None:
    base = encode_memory(FULL, NOW)
    refresh = refresh_period(1.0)
    assert refresh == MEMORY_REFRESH_S and refresh_period(120.0) == 120.0
    assert memory_due(None, base, NOW, refresh)
    assert memory_due({}, base, NOW, refresh)
    copy = stored(base)
    moved = PlannerMemory(**{**_fields(FULL), "demand": 2.5, "demand_s": NOW + 1, "demand_slope": 0.3})
    assert not memory_due(copy, encode_memory(moved, NOW + 1), NOW + 1, refresh)
    assert memory_due(copy, encode_memory(moved, NOW + refresh), NOW + refresh, refresh)
    scaled = PlannerMemory(**{**_fields(FULL), "last_scale_up_s": NOW + 1})
    assert memory_due(copy, encode_memory(scaled, NOW + 1), NOW + 1, refresh)
    busy = PlannerMemory(**{**_fields(FULL), "calm_since_s": None})
    assert memory_due(copy, encode_memory(busy, NOW + 1), NOW + 1, refresh)  # quiet period ended
    busy_copy = stored(encode_memory(busy, NOW))
    # a quiet period that just began can wait: forgetting it only delays a scale-down
    assert not memory_due(busy_copy, encode_memory(FULL, NOW + 1), NOW + 1, refresh)
    assert memory_due(busy_copy, encode_memory(FULL, NOW + refresh), NOW + refresh, refresh)


def _fields(memory: PlannerMemory) -> dict[str, Any]:
    return {name: getattr(memory, name) for name in PlannerMemory.__slots__}


# ------------------------------------------------------------------ what it is for


def busy_fleet(now: float) -> FleetObservation:
    replicas = tuple(ReplicaObservation(f"r{i}", "ready", in_flight=4, est_wait_s=5.0) for i in range(2))
    return FleetObservation(now_s=now, replicas=replicas)


def test_a_restored_memory_holds_the_scale_up_cooldown_a_fresh_one_would_not() -> None:
    policy = ScalePolicy(mode="prefix_aware", max_replicas=4, scale_up_cooldown_s=60, target_load=1.0,
                         scale_down_load=0.5)  # fmt: skip
    scaled_at = NOW - 10
    status = status_of(stored(encode_memory(PlannerMemory(last_scale_up_s=scaled_at), scaled_at)))
    restored = decode_memory(status, NOW, STALE).memory
    assert plan_scale(busy_fleet(NOW), policy, restored).add == 0  # inside the remembered cooldown
    assert plan_scale(busy_fleet(NOW), policy, PlannerMemory()).add == 1  # what a fresh operator did
    assert plan_scale(busy_fleet(scaled_at + 60), policy, restored).add == 1  # once it has passed


def quiet_fleet(now: float) -> FleetObservation:
    replicas = tuple(ReplicaObservation(f"r{i}", "ready") for i in range(3))
    return FleetObservation(now_s=now, replicas=replicas)


def test_a_restored_quiet_period_is_not_restarted_by_the_restart() -> None:
    policy = ScalePolicy(mode="prefix_aware", max_replicas=4, scale_down_stabilization_s=60)
    calm_since = NOW - 50
    written = PlannerMemory(last_scale_up_s=NOW - 3600, calm_since_s=calm_since)
    restored = decode_memory(status_of(stored(encode_memory(written, NOW - 1))), NOW, STALE).memory
    assert plan_scale(quiet_fleet(NOW), policy, restored).drain == ()  # 50 s of the 60 s window
    assert len(plan_scale(quiet_fleet(calm_since + 60), policy, restored).drain) == 1  # 10 s later
    # a fresh memory would have waited the whole window again from the restart
    assert plan_scale(quiet_fleet(calm_since + 60), policy, PlannerMemory()).drain == ()


def test_an_operator_adopts_a_memory_another_operator_wrote_after_its_own() -> None:
    from prefixfleet.operator.autoscale_handlers import FleetAutoscale, _written_elsewhere

    mine = FleetAutoscale(stored_memory=stored(encode_memory(FULL, NOW)))
    theirs_later = status_of(stored(encode_memory(PlannerMemory(last_scale_up_s=NOW + 4), NOW + 5)))
    assert _written_elsewhere(mine, theirs_later)  # a failover and back: their cooldown counts
    assert not _written_elsewhere(mine, status_of(stored(encode_memory(FULL, NOW))))  # my own write
    assert not _written_elsewhere(mine, status_of(stored(encode_memory(FULL, NOW - 30))))  # a lagging view
    assert not _written_elsewhere(FleetAutoscale(), theirs_later)  # nothing written yet: restored already
