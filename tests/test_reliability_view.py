"""A gateway's fleet view across a Redis outage (pure: FleetView fed snapshots by hand).

Specification: while Redis is unreachable the view freezes; when it answers again (even empty, after
a restart) the outage's duration is not counted against any worker's heartbeat, so every worker
stays routable for ``dead_after_s`` while the sidecars (whose publishing backs off during the
outage) re-register — a gateway never answers 503 just because Redis restarted.
"""

from __future__ import annotations

from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.router.view import FleetView


def member() -> str:
    return encode_record(MemberRecord(url="http://127.0.0.1:9", model="m", revision="r"))


def load(seq: int) -> str:
    return encode_record(LoadReport(seq, float(seq), "ready", True, 0, 0, 0, 1000.0, 0, 100, 0))


def routable(view: FleetView, now: float) -> list[str]:
    return sorted(w.worker_id for w in view.routable(now))


def test_after_a_redis_outage_workers_stay_routable_until_they_re_register():
    view = FleetView(dead_after_s=3.0)
    both = {"a": member(), "b": member()}
    view.apply_snapshot(both, {"a": load(1), "b": load(1)}, now=0.0)
    view.apply_snapshot(both, {"a": load(2), "b": load(2)}, now=0.2)
    for _ in range(100):  # 30 s of failed reads
        view.refresh_failed()
    assert routable(view, 30.0) == ["a", "b"]
    # Redis restarted empty: nothing registered yet, everyone stays (the outage is forgiven)
    view.apply_snapshot({}, {}, now=30.2)
    assert routable(view, 30.2) == ["a", "b"]
    # one sidecar re-registered, the other not yet: the missing one is not dropped at once
    view.apply_snapshot({"a": member()}, {"a": load(3)}, now=31.0)
    assert routable(view, 31.0) == ["a", "b"]
    view.apply_snapshot(both, {"a": load(4), "b": load(3)}, now=31.5)
    assert routable(view, 31.5) == ["a", "b"]


def test_a_worker_that_really_died_during_the_outage_is_dropped_after_dead_after():
    view = FleetView(dead_after_s=3.0)
    both = {"a": member(), "b": member()}
    view.apply_snapshot(both, {"a": load(1), "b": load(1)}, now=0.0)
    view.refresh_failed()
    view.apply_snapshot({}, {}, now=20.0)
    t, seq = 20.0, 2
    while t < 25.0:  # only "a" comes back and keeps beating
        t += 0.5
        seq += 1
        view.apply_snapshot({"a": member()}, {"a": load(seq)}, now=t)
    assert routable(view, t) == ["a"]
    assert "b" not in view.workers


def test_without_a_failed_read_a_slow_refresh_is_not_mistaken_for_an_outage():
    view = FleetView(dead_after_s=3.0)
    both = {"a": member(), "b": member()}
    view.apply_snapshot(both, {"a": load(1), "b": load(1)}, now=0.0)
    view.apply_snapshot(both, {"a": load(2), "b": load(1)}, now=2.0)
    view.apply_snapshot(both, {"a": load(3), "b": load(1)}, now=4.0)
    assert routable(view, 4.0) == ["a"]  # b's heartbeat stopped 4 s ago
