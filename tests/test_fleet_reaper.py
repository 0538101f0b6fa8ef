"""Which replicas of the local fleet are dead, and which come back (plan_reaping: plain data in).

Specification:
* a replica with a process that exited without being asked to is reaped, and the log line names the
  replica, the process and its exit (a signal by name);
* a replica being stopped on purpose (the autoscaler's drain, the teardown) is left alone, even once
  its processes have exited;
* without the autoscaler a dead replica restarts, but not if it dies again within the window after
  its last restart; with the autoscaler it never restarts here (the planner replaces it).
"""

from __future__ import annotations

from prefixfleet.fleet.local import LocalFleet
from prefixfleet.fleet.reaper import (
    RESTART_WINDOW_S,
    ProcessState,
    Reaping,
    ReplicaStatus,
    describe_exit,
    plan_reaping,
)


def replica(
    name: str, sidecar: int | None = None, engine: int | None = None, *, stopping: bool = False
) -> ReplicaStatus:
    return ReplicaStatus(
        name, (ProcessState("sidecar", sidecar, stopping), ProcessState("engine", engine, stopping))
    )


def test_running_replicas_are_left_alone() -> None:
    assert plan_reaping([replica("replica-0"), replica("replica-1")], {}, 100.0, restart=True) == []


def test_a_killed_sidecar_is_reaped_and_restarted() -> None:
    plan = plan_reaping([replica("replica-0"), replica("replica-1", sidecar=-9)], {}, 100.0, restart=True)
    assert plan == [Reaping("replica-1", (ProcessState("sidecar", -9),), restart=True, why="restarting it")]
    assert plan[0].line() == (
        "replica-1: sidecar exited with code -9 (SIGKILL); removed from membership; restarting it"
    )


def test_a_dead_engine_takes_its_replica_out_too() -> None:
    (reaping,) = plan_reaping([replica("replica-2", engine=1)], {}, 100.0, restart=True)
    assert reaping.name == "replica-2" and reaping.restart
    assert reaping.line().startswith("replica-2: engine exited with code 1; removed from membership")


def test_both_processes_dead_are_both_named() -> None:
    (reaping,) = plan_reaping([replica("replica-0", sidecar=-9, engine=-15)], {}, 100.0, restart=True)
    assert reaping.line().startswith(
        "replica-0: sidecar exited with code -9 (SIGKILL) and engine exited with code -15 (SIGTERM);"
    )


def test_a_replica_being_stopped_on_purpose_is_not_reaped() -> None:
    draining = replica("replica-1", sidecar=0, stopping=True)
    half_stopped = ReplicaStatus(
        "replica-2", (ProcessState("sidecar", 0, stop_requested=True), ProcessState("engine", None))
    )
    assert plan_reaping([draining, half_stopped], {}, 100.0, restart=True) == []


def test_a_replica_dying_again_soon_after_its_restart_stays_down() -> None:
    restarted_at = {"replica-1": 100.0}
    (soon,) = plan_reaping([replica("replica-1", sidecar=-9)], restarted_at, 103.0, restart=True)
    assert not soon.restart
    assert soon.line() == (
        "replica-1: sidecar exited with code -9 (SIGKILL); removed from membership; "
        f"not restarted again: it died 3.0s after its restart (within {RESTART_WINDOW_S:g}s)"
    )
    later = 100.0 + RESTART_WINDOW_S + 0.5
    (again,) = plan_reaping([replica("replica-1", sidecar=-9)], restarted_at, later, restart=True)
    assert again.restart  # it ran longer than the window: one more restart
    (other,) = plan_reaping([replica("replica-0", sidecar=-9)], restarted_at, 103.0, restart=True)
    assert other.restart  # the window is per replica


def test_with_the_autoscaler_nothing_restarts_here() -> None:
    (reaping,) = plan_reaping([replica("replica-1", sidecar=-9)], {}, 100.0, restart=False)
    assert not reaping.restart
    assert reaping.line().endswith("removed from membership; not restarted: the autoscaler replaces replicas")


def test_exit_codes_read_plainly() -> None:
    assert describe_exit(-9) == "-9 (SIGKILL)"
    assert describe_exit(3) == "3"
    assert describe_exit(0) == "0"
    assert describe_exit(-200) == "-200"  # not a signal number


def test_replica_processes_are_recognised_by_name() -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    names = ["engine-0", "sidecar-12", "gateway-0-queue_aware", "redis", "engine-x"]
    assert [LocalFleet.is_replica_process(Named(n)) for n in names] == [True, True, False, False, False]  # type: ignore[arg-type]
