"""The reconcile planner, specified with plain data: desired pods, rolling updates, status, idempotency."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import (
    ANNOTATION_SPEC_HASH,
    ANNOTATION_TEMPLATE_HASH,
    LABEL_FLEET,
    LABEL_ROLE,
    FleetRef,
    ObservedPod,
    ObservedState,
    ReconcilePlan,
    observe_pod,
    plan_invalid_spec,
    plan_reconcile,
    plan_unhealthy,
    pod_url,
    replica_template,
    stays_unavailable,
    unavailable_while_invalid,
    unready_mark,
    unready_since,
)

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1", generation=3)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def spec(replicas: int = 2, **engine: object) -> FleetSpec:
    return FleetSpec.model_validate(
        {"model": {"name": "m"}, "engine": {"kind": "emulator", **engine}, "replicas": replicas}
    )


def template_hash(s: FleetSpec) -> str:
    return replica_template(FLEET, s, "redis://r:6379/0")[1]


def state(pods: list[ObservedPod], children: dict[str, str] | None = None, **kw: object) -> ObservedState:
    """Observed state; drains are instant unless a test asks for them (drain_seconds)."""
    kw.setdefault("drain_seconds", 0.0)
    return ObservedState(pods=pods, children=children or {}, redis_url="redis://r:6379/0", now=NOW, **kw)


def pod(
    name: str,
    h: str,
    ready: bool = True,
    phase: str = "Running",
    created: str = "2026-01-01T00:00:00Z",
    **kw: object,
) -> ObservedPod:
    return ObservedPod(name=name, template_hash=h, phase=phase, ready=ready, created=created, **kw)


def apply(plan: ReconcilePlan, observed: ObservedState, ready: bool = True) -> ObservedState:
    """What the cluster looks like after executing the plan (new pods as `ready`)."""
    gone = {d.name for d in plan.delete_pods}
    pods = [p for p in observed.pods if p.name not in gone]
    for manifest in plan.create_pods:
        meta = manifest["metadata"]
        pods.append(
            pod(
                meta["name"],
                meta["annotations"][ANNOTATION_TEMPLATE_HASH],
                ready=ready,
                created=f"2026-01-01T00:{len(pods):02d}:00Z",
            )
        )
    drain, undrain = set(plan.drain_pods), set(plan.undrain_pods)
    stamp = observed.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    pods = [replace(p, draining_since=stamp) if p.name in drain else p for p in pods]
    pods = [replace(p, draining_since="") if p.name in undrain else p for p in pods]
    pods = [replace(p, first_ready=stamp) if p.name in plan.mark_ready else p for p in pods]
    seen = {name: json.loads(mark)["at"] for name, mark in plan.mark_unready}
    pods = [replace(p, unready_seen=seen[p.name]) if p.name in seen else p for p in pods]
    children = dict(observed.children)
    for change in plan.children:
        children[change.key] = change.manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    return replace(
        observed, pods=pods, children=children, router_ready_replicas=1, conditions=plan.status["conditions"]
    )


def converge(
    s: FleetSpec, observed: ObservedState, steps: int = 20
) -> tuple[ObservedState, list[ReconcilePlan]]:
    plans = []
    for _ in range(steps):
        plan = plan_reconcile(FLEET, s, observed)
        plans.append(plan)
        if plan.is_noop:
            return observed, plans
        observed = apply(plan, observed)
    raise AssertionError(f"no convergence in {steps} steps")


def test_a_new_fleet_gets_named_replica_pods_and_a_router() -> None:
    plan = plan_reconcile(FLEET, spec(2), state([]))
    names = [p["metadata"]["name"] for p in plan.create_pods]
    assert names == ["chat-replica-0", "chat-replica-1"]
    first = plan.create_pods[0]
    assert (
        first["metadata"]["labels"][LABEL_FLEET] == "chat"
        and first["metadata"]["labels"][LABEL_ROLE] == "replica"
    )
    assert first["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    engine, sidecar = first["spec"]["containers"]
    assert engine["command"] == ["prefixfleet", "emulator"] and "--port" in engine["args"]
    assert sidecar["command"] == ["prefixfleet", "router", "sidecar"]
    args = sidecar["args"]
    assert args[args.index("--engine") + 1] == "http://127.0.0.1:30000"
    assert args[args.index("--worker-id") + 1] == "$(POD_NAME)"
    assert args[args.index("--advertise-url") + 1] == "http://$(POD_IP):8100"
    assert args[args.index("--fleet") + 1] == "team-a.chat"
    assert sorted(c.key for c in plan.children) == [
        "ConfigMap/chat-router",
        "Deployment/chat-router",
        "Service/chat-router",
    ]
    assert all(c.action == "create" for c in plan.children)
    assert plan.status["selector"] == "prefixfleet.io/fleet=chat,prefixfleet.io/role=replica"
    assert plan.status["routerEndpoint"] == "http://chat-router.team-a.svc:8080"


def test_executing_the_plan_and_replanning_yields_an_empty_plan() -> None:
    observed, plans = converge(spec(3), state([]))
    # create the pods; once they are Ready, mark them as having served; then nothing
    assert len(plans) == 3 and plans[-1].is_noop and not plans[-1].events
    assert sorted(plans[1].mark_ready) == [f"chat-replica-{i}" for i in range(3)] and not plans[1].events
    conditions = {c["type"]: (c["status"], c["reason"]) for c in plans[-1].status["conditions"]}
    assert conditions == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "ReconcileComplete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert plans[-1].status["readyReplicas"] == 3 and plans[-1].status["observedGeneration"] == 3
    # transition times are kept when nothing changes, so the status patch becomes empty
    again = plan_reconcile(FLEET, spec(3), replace(observed, conditions=plans[-1].status["conditions"]))
    assert again.status == plans[-1].status


def test_pods_being_created_are_not_created_twice() -> None:
    # the operator died after creating replica-0 but before anything else: replanning creates only replica-1
    h = template_hash(spec(2))
    plan = plan_reconcile(FLEET, spec(2), state([pod("chat-replica-0", h, ready=False, phase="Pending")]))
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["chat-replica-1"]
    assert not plan.delete_pods


def test_a_failed_pod_is_replaced_and_marks_degraded() -> None:
    h = template_hash(spec(2))
    observed = state(
        [pod("chat-replica-0", h), pod("chat-replica-1", h, ready=False, phase="Failed")], children={}
    )
    plan = plan_reconcile(FLEET, spec(2), observed)
    assert [d.name for d in plan.delete_pods] == ["chat-replica-1"]
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["chat-replica-2"]  # the name is still taken
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ReplicaFailed"
    assert any(e.type == "Warning" for e in plan.events)


def test_scale_down_removes_not_ready_then_autoscaler_victim_then_newest() -> None:
    h = template_hash(spec(4))
    pods = [pod(f"chat-replica-{i}", h, created=f"2026-01-01T00:0{i}:00Z") for i in range(4)]
    newest_first = plan_reconcile(FLEET, spec(3), state(pods))
    assert [d.name for d in newest_first.delete_pods] == ["chat-replica-3"]
    victim = plan_reconcile(FLEET, spec(3), state(pods, victims=["chat-replica-1"]))
    assert [d.name for d in victim.delete_pods] == ["chat-replica-1"]
    pods[0] = replace(pods[0], ready=False)
    not_ready = plan_reconcile(FLEET, spec(3), state(pods, victims=["chat-replica-1"]))
    assert [d.name for d in not_ready.delete_pods] == ["chat-replica-0"]
    cheap = [replace(p, deletion_cost=0 if p.name == "chat-replica-2" else 100) for p in pods[1:]]
    assert [d.name for d in plan_reconcile(FLEET, spec(2), state(cheap)).delete_pods] == ["chat-replica-2"]


def test_rolling_update_surges_by_one_and_never_drops_below_the_ready_count() -> None:
    old = spec(3)
    observed, _ = converge(old, state([]))
    new = spec(3, args=["--cache-tokens", "5000"])
    assert template_hash(new) != template_hash(old)
    for _ in range(20):
        plan = plan_reconcile(FLEET, new, observed)
        if plan.is_noop:
            break
        # execute in two phases as the cluster would: new pods start not ready, then become ready
        observed = apply(plan, observed, ready=False)
        alive = [p for p in observed.pods if p.alive]
        assert len(alive) <= 4  # replicas + surge 1
        assert sum(p.ready for p in alive) >= 3  # max unavailable 0
        observed = replace(observed, pods=[replace(p, ready=True) for p in observed.pods])
    else:
        raise AssertionError("rolling update did not converge")
    assert {p.template_hash for p in observed.pods} == {template_hash(new)}
    assert len(observed.pods) == 3


def test_a_router_change_replaces_only_what_changed() -> None:
    observed, _ = converge(spec(1), state([]))
    changed = FleetSpec.model_validate({**spec(1).to_wire(), "router": {"policy": "round_robin"}})
    plan = plan_reconcile(FLEET, changed, observed)
    assert sorted(c.key for c in plan.children) == ["ConfigMap/chat-router", "Deployment/chat-router"]
    assert all(c.action == "replace" for c in plan.children) and not plan.create_pods


def test_scaled_to_zero_is_ready_and_has_no_pods() -> None:
    h = template_hash(spec(1))
    plan = plan_reconcile(FLEET, spec(0), state([pod("chat-replica-0", h)]))
    assert [d.name for d in plan.delete_pods] == ["chat-replica-0"]
    observed, plans = converge(spec(0), state([]))
    assert not observed.pods
    assert next(c for c in plans[-1].status["conditions"] if c["type"] == "Ready")["reason"] == "ScaledToZero"


def test_the_operators_own_image_replaces_the_default_project_image() -> None:
    custom = spec(1, image="example.org/own-emulator:1")
    plan = plan_reconcile(FLEET, custom, replace(state([]), project_image="registry.local/prefixfleet:dev"))
    images = {c["name"]: c["image"] for c in plan.create_pods[0]["spec"]["containers"]}
    assert images == {"engine": "example.org/own-emulator:1", "sidecar": "registry.local/prefixfleet:dev"}
    deployment = next(c.manifest for c in plan.children if c.manifest["kind"] == "Deployment")
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/prefixfleet:dev"
    )


def test_a_serving_replica_is_drained_before_it_is_deleted() -> None:
    h = template_hash(spec(3))
    pods = [pod(f"chat-replica-{i}", h, created=f"2026-01-01T00:0{i}:00Z") for i in range(3)]
    observed = state(pods, drain_seconds=15.0)
    first = plan_reconcile(FLEET, spec(2), observed)
    assert first.drain_pods == ("chat-replica-2",) and not first.delete_pods
    assert any(e.reason == "DrainingReplica" for e in first.events)
    draining = apply(first, observed)
    progressing = next(c for c in plan_reconcile(FLEET, spec(2), draining).status["conditions"]
                       if c["type"] == "Progressing")  # fmt: skip
    assert progressing["reason"] == "Draining"

    def at(seconds: float, in_flight: int | None) -> ReconcilePlan:
        later = [replace(p, in_flight=in_flight) for p in draining.pods]
        return plan_reconcile(
            FLEET, spec(2), replace(draining, pods=later, now=NOW + timedelta(seconds=seconds))
        )

    assert at(1, 0).is_noop  # gateways may not have seen the drain yet
    assert at(5, 3).is_noop  # requests still in flight
    assert [d.name for d in at(5, 0).delete_pods] == ["chat-replica-2"]  # drained
    assert [d.name for d in at(16, 3).delete_pods] == ["chat-replica-2"]  # drain timed out


def test_a_drain_is_undone_when_the_replica_is_wanted_again() -> None:
    h = template_hash(spec(3))
    pods = [pod(f"chat-replica-{i}", h) for i in range(3)]
    pods[2] = replace(pods[2], draining_since="2026-01-01T00:00:00Z")
    plan = plan_reconcile(FLEET, spec(3), state(pods, drain_seconds=15.0))
    assert plan.undrain_pods == ("chat-replica-2",) and not plan.delete_pods and not plan.create_pods


def test_a_rolling_update_with_drains_keeps_serving_capacity() -> None:
    observed, _ = converge(spec(2), state([]))
    observed = replace(observed, drain_seconds=15.0)
    new = spec(2, args=["--cache-tokens", "5000"])
    for step in range(40):
        plan = plan_reconcile(FLEET, new, observed)
        if plan.is_noop and not any(p.draining for p in observed.pods):
            break
        observed = apply(plan, observed)
        assert sum(p.serving for p in observed.pods) >= 2 or step == 0
        assert len([p for p in observed.pods if p.alive]) <= 3
        observed = replace(observed, now=observed.now + timedelta(seconds=20))  # drains time out
    else:
        raise AssertionError("rolling update with drains did not converge")
    assert {p.template_hash for p in observed.pods} == {template_hash(new)} and len(observed.pods) == 2


def test_a_fleet_without_redis_is_degraded() -> None:
    plan = plan_reconcile(FLEET, spec(1), replace(state([]), redis_url=""))
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NoRedis") and "spec.redis" in degraded[
        "message"
    ]


def test_invalid_spec_status_names_the_field() -> None:
    status = plan_invalid_spec(FLEET, ["spec.replicas: must be >= 0"], state([]))
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "spec.replicas" in degraded["message"]


def test_observed_pods_and_their_reachable_address() -> None:
    body = {
        "metadata": {
            "name": "chat-replica-0",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {
                ANNOTATION_TEMPLATE_HASH: "abc",
                "prefixfleet.io/port-map": '{"8100": 41001}',
                "controller.kubernetes.io/pod-deletion-cost": "7",
            },
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    observed = observe_pod(body)
    assert (
        observed.ready and observed.alive and observed.template_hash == "abc" and observed.deletion_cost == 7
    )
    assert pod_url(observed, 8100) == "http://127.0.0.1:41001"
    assert pod_url(replace(observed, port_map={}), 8100) == "http://127.0.0.1:8100"
    assert pod_url(replace(observed, pod_ip=None), 8100) is None


def test_pod_template_override_merges_into_the_replica() -> None:
    s = spec(
        1,
        podTemplate={
            "spec": {
                "nodeSelector": {"gpu": "h100"},
                "containers": [{"name": "engine", "workingDir": "/models"}],
            }
        },
    )
    plan = plan_reconcile(FLEET, s, state([]))
    pod_spec = plan.create_pods[0]["spec"]
    assert pod_spec["nodeSelector"] == {"gpu": "h100"}
    engine = next(c for c in pod_spec["containers"] if c["name"] == "engine")
    assert engine["workingDir"] == "/models" and engine["command"] == ["prefixfleet", "emulator"]


def test_sglang_engines_always_serve_the_metrics_the_fleet_reads() -> None:
    # sglang:* series feed the sidecar's /metrics, the autoscaler, the dashboard and the alerts;
    # SGLang serves them only with --enable-metrics, which a spec should not have to remember.
    for extra in ([], ["--enable-metrics"]):
        template, _ = replica_template(FLEET, spec(kind="sglang", args=extra), "redis://r:6379/0")
        (engine,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
        assert engine["command"][:3] == ["python3", "-m", "sglang.launch_server"]
        assert engine["args"].count("--enable-metrics") == 1


# ---------------------------------------------------------------------------------------------
# Unhealthy replicas. The engine listens on loopback, so no kubelet probe restarts a hung one; the
# pod only turns unready (its sidecar's /health proxies to the engine). Specification:
# * a replica that was Ready (the operator's first-ready mark) and has been unready longer than
#   spec.engine.replaceUnreadyAfterSeconds (default 120, 0 = never) is deleted, so the next reconcile
#   recreates it; a Warning Event ReplicaUnhealthy names it and for how long; Degraded says so;
# * one that never was Ready, or whose engine the kubelet restarted since it turned unready (loading
#   again), is starting: only spec.engine.replaceNeverReadyAfterSeconds (default 0 = never) applies;
# * Pending, draining, Ready pods and pods without a readable transition time are never replaced;
# * one replacement at a time: none while a pod is created, removed or still starting, so a
#   fleet-wide outage costs one replica, not all of them.

T0 = "2026-01-01T00:00:00Z"
SERVED = "2025-12-31T23:00:00Z"  # the first-ready mark of pods that served


def unready(name: str, h: str, since: str = T0, **kw: object) -> ObservedPod:
    """Unready since ``since``, which the operator saw at once (its unready-seen mark)."""
    kw.setdefault("first_ready", SERVED)
    kw.setdefault("unready_seen", since)
    return pod(name, h, ready=False, ready_changed=since, created="2025-12-31T22:00:00Z", **kw)


def at(seconds: float, pods: list[ObservedPod], **kw: object) -> ObservedState:
    """The pods ``seconds`` after T0, with the router already in place."""
    router = converge(spec(1), state([]))[0].children
    return replace(state(pods, children=router, **kw), now=NOW + timedelta(seconds=seconds))


def degraded_of(plan: ReconcilePlan) -> dict[str, object]:
    return next(c for c in plan.status["conditions"] if c["type"] == "Degraded")


def test_the_knobs_default_to_two_minutes_and_off() -> None:
    engine = spec().engine
    assert (engine.replace_unready_after_seconds, engine.replace_never_ready_after_seconds) == (120, 0)


def test_a_replica_that_served_and_stays_unready_is_replaced_and_said_so() -> None:
    h = template_hash(spec(2))
    pods = [pod("chat-replica-0", h, first_ready=SERVED), unready("chat-replica-1", h)]
    early = plan_reconcile(FLEET, spec(2), at(100, pods))
    assert early.is_noop and degraded_of(early)["status"] == "False"  # a short hiccup is left alone
    assert early.recheck_after_s == 20.0  # look again when its allowance runs out

    plan = plan_reconcile(FLEET, spec(2), at(130, pods))
    assert [d.name for d in plan.delete_pods] == ["chat-replica-1"] and not plan.create_pods
    (replaced,) = plan.replaced
    assert (replaced.name, replaced.reason, replaced.seconds) == ("chat-replica-1", "unready", 130.0)
    (event,) = plan.events
    assert (event.type, event.reason) == ("Warning", "ReplicaUnhealthy")
    assert "chat-replica-1" in event.message and "130s" in event.message
    assert "replaceUnreadyAfterSeconds=120" in event.message
    degraded = degraded_of(plan)
    assert degraded["status"] == "True" and degraded["reason"] == "ReplicaUnhealthy"
    assert "chat-replica-1" in str(degraded["message"]) and "replacing it" in str(degraded["message"])

    # the next reconcile recreates the replica under the same name
    after = plan_reconcile(FLEET, spec(2), at(131, [pods[0]]))
    assert [p["metadata"]["name"] for p in after.create_pods] == ["chat-replica-1"]
    assert degraded_of(after)["status"] == "False"


def test_the_unready_allowance_is_configurable_and_zero_turns_it_off() -> None:
    h = template_hash(spec(1))
    pods = [unready("chat-replica-0", h)]
    assert plan_reconcile(FLEET, spec(1, replaceUnreadyAfterSeconds=30), at(31, pods)).replaced
    off = plan_reconcile(FLEET, spec(1, replaceUnreadyAfterSeconds=0), at(10**6, pods))
    assert off.is_noop and not off.replaced and off.recheck_after_s is None


def test_a_replica_that_never_came_up_is_left_to_load_unless_asked() -> None:
    h = template_hash(spec(1))
    loading = [unready("chat-replica-0", h, first_ready="")]  # Running, never Ready: loading a model
    assert plan_reconcile(FLEET, spec(1), at(10**5, loading)).is_noop
    s = spec(1, replaceNeverReadyAfterSeconds=1800)
    assert plan_reconcile(FLEET, s, at(1799, loading)).is_noop
    plan = plan_reconcile(FLEET, s, at(1800, loading))
    assert [u.reason for u in plan.replaced] == ["never_ready"]
    assert "has not been Ready for 1800s" in plan.events[0].message
    assert "replaceNeverReadyAfterSeconds=1800" in plan.events[0].message


def test_an_engine_the_kubelet_restarted_is_loading_again_not_hung() -> None:
    h = template_hash(spec(1))
    # it served, crashed at T0, and the kubelet started the engine again a few seconds later
    restarted = [unready("chat-replica-0", h, engine_started="2026-01-01T00:00:05Z")]
    assert plan_reconcile(FLEET, spec(1), at(600, restarted)).is_noop
    s = spec(1, replaceNeverReadyAfterSeconds=900)
    assert [u.reason for u in plan_reconcile(FLEET, s, at(900, restarted)).replaced] == ["never_ready"]
    # an engine process that started before the pod turned unready is the one that hung
    hung = [unready("chat-replica-0", h, engine_started="2025-12-31T22:00:10Z")]
    assert [u.reason for u in plan_reconcile(FLEET, spec(1), at(121, hung)).replaced] == ["unready"]
    # crash-looping: between two restarts its engine waits out a back-off, not running; still the
    # kubelet's to restart, not hung (before: replaced whenever a reconcile fell in a back-off)
    backoff = [unready("chat-replica-0", h, engine_down=True)]
    assert plan_reconcile(FLEET, spec(1), at(600, backoff)).is_noop
    assert [u.reason for u in plan_reconcile(FLEET, s, at(900, backoff)).replaced] == ["never_ready"]


def test_pending_draining_and_unreadable_pods_are_never_replaced() -> None:
    h = template_hash(spec(1))
    s = spec(1, replaceNeverReadyAfterSeconds=60)
    cases = [
        unready("chat-replica-0", h, phase="Pending", first_ready=""),  # waiting for a node or an image
        unready("chat-replica-0", h, since=""),  # no transition time: unknown, not old
        unready("chat-replica-0", h, since="yesterday"),
    ]
    for case in cases:
        assert plan_reconcile(FLEET, s, at(10**5, [case])).replaced == (), case
    # a draining pod is being removed anyway (as a scale-down victim), not replaced
    draining = unready("chat-replica-1", h, draining_since=T0)
    plan = plan_reconcile(FLEET, s, at(10**5, [pod("chat-replica-0", h, first_ready=SERVED), draining]))
    assert plan.replaced == () and [d.name for d in plan.delete_pods] == ["chat-replica-1"]


def test_a_fleet_wide_outage_costs_one_replica_not_all() -> None:
    # Redis or the model store is down: every engine is unready at once. One replica is replaced
    # (the longest unready); its replacement cannot come up either, which holds back the others.
    h = template_hash(spec(4))
    pods = [unready(f"chat-replica-{i}", h, since=f"2026-01-01T00:00:0{i}Z") for i in range(4)]
    observed = at(300, pods)
    deleted: list[str] = []
    for minute in range(30):
        plan = plan_reconcile(FLEET, spec(4), observed)
        deleted += [d.name for d in plan.delete_pods]
        observed = apply(plan, observed, ready=False)  # created pods: Running, never Ready
        observed = replace(
            observed,
            pods=[replace(p, ready_changed=p.ready_changed or T0) for p in observed.pods],
            now=observed.now + timedelta(minutes=1),
        )
        if minute == 10:
            degraded = degraded_of(plan)
            assert degraded["reason"] == "ReplicaUnhealthy"
            assert "held back while chat-replica-0 is still starting" in str(degraded["message"])
            assert "2 more unhealthy" in str(degraded["message"])
    assert deleted == ["chat-replica-0"]


def test_an_outage_with_the_never_ready_knob_churns_only_the_replacement() -> None:
    # Same outage, replaceNeverReadyAfterSeconds=300: the replacement that cannot come up is itself
    # replaced every 300 s (what the knob asks for), but the three replicas that served and hold warm
    # caches stay: a fresh pod not coming up points at the shared cause. (Before, each overdue
    # replacement stopped holding back and a warm replica went every 300 s, until all had.)
    h = template_hash(spec(4))
    s = spec(4, replaceNeverReadyAfterSeconds=300)
    pods = [unready(f"chat-replica-{i}", h, since=f"2026-01-01T00:00:0{i}Z") for i in range(4)]
    observed = at(300, pods)
    deleted: list[str] = []
    said: set[str] = set()
    for _ in range(60):
        plan = plan_reconcile(FLEET, s, observed)
        deleted += [d.name for d in plan.delete_pods]
        said.add(str(degraded_of(plan)["message"]))
        observed = apply(plan, observed, ready=False)  # created pods: Running, never Ready
        stamp = observed.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        observed = replace(
            observed,
            pods=[replace(p, ready_changed=p.ready_changed or stamp) for p in observed.pods],
            now=observed.now + timedelta(minutes=1),
        )
    assert set(deleted) == {"chat-replica-0"} and len(deleted) > 1  # the cold one, again and again
    assert {p.name for p in observed.pods if p.was_ready} == {f"chat-replica-{i}" for i in (1, 2, 3)}
    assert any(
        m.startswith("chat-replica-0 never Ready") and m.endswith("replacing it; 3 more unhealthy")
        for m in said
    )


def test_a_replica_that_never_came_up_goes_before_one_that_served() -> None:
    h = template_hash(spec(2))
    s = spec(2, replaceNeverReadyAfterSeconds=60)
    pods = [
        unready("chat-replica-0", h),
        unready("chat-replica-1", h, since="2026-01-01T00:01:00Z", first_ready=""),
    ]
    plan = plan_reconcile(FLEET, s, at(200, pods))
    assert [(u.name, u.reason) for u in plan.replaced] == [("chat-replica-1", "never_ready")]
    assert "chat-replica-1 never Ready" in str(degraded_of(plan)["message"])


def test_hung_replicas_are_replaced_one_at_a_time() -> None:
    h = template_hash(spec(3))
    pods = [pod("chat-replica-0", h, first_ready=SERVED), unready("chat-replica-1", h),
            unready("chat-replica-2", h, since="2026-01-01T00:00:30Z")]  # fmt: skip
    observed = at(200, pods)
    first = plan_reconcile(FLEET, spec(3), observed)
    assert [u.name for u in first.replaced] == ["chat-replica-1"]  # unready the longest
    # while it is recreated and loads, the other one waits
    gone = replace(observed, pods=[p for p in pods if p.name != "chat-replica-1"])
    creating = plan_reconcile(FLEET, spec(3), gone)
    assert creating.create_pods and not creating.replaced
    starting = apply(creating, gone, ready=False)
    assert not plan_reconcile(FLEET, spec(3), starting).replaced
    terminating = replace(observed, pods=[replace(pods[1], terminating=True), *pods[::2]])
    assert not plan_reconcile(FLEET, spec(3), terminating).replaced  # its replacement is being created
    # once the replacement is Ready, the next hung replica goes
    up = replace(starting, pods=[replace(p, ready=True) if not p.ready_changed else p for p in starting.pods])
    assert [u.name for u in plan_reconcile(FLEET, spec(3), up).replaced] == ["chat-replica-2"]


def test_a_pod_stuck_terminating_does_not_hold_back_replacements_forever() -> None:
    # replica-1 was replaced, but its node is gone: it stays Terminating; replica-3 took its place
    h = template_hash(spec(3))
    pods = [pod("chat-replica-0", h, first_ready=SERVED), unready("chat-replica-1", h, terminating=True),
            unready("chat-replica-2", h), pod("chat-replica-3", h, first_ready=SERVED)]  # fmt: skip
    assert [u.name for u in plan_reconcile(FLEET, spec(3), at(200, pods)).replaced] == ["chat-replica-2"]


def test_a_replica_briefly_unready_does_not_hold_back_a_hung_one() -> None:
    h = template_hash(spec(3))
    pods = [pod("chat-replica-0", h, first_ready=SERVED), unready("chat-replica-1", h),
            unready("chat-replica-2", h, since="2026-01-01T00:02:50Z")]  # fmt: skip
    plan = plan_reconcile(FLEET, spec(3), at(180, pods))
    assert [u.name for u in plan.replaced] == ["chat-replica-1"]


def test_a_pod_no_node_has_room_for_does_not_hold_back_a_hung_one() -> None:
    # the autoscaler asked for a third replica the cluster has no GPU for: it stays Pending (for
    # hours while nodes are added, or for ever); a hung replica is still replaced meanwhile
    h = template_hash(spec(3))
    waiting = pod("chat-replica-2", h, ready=False, phase="Pending", unschedulable=True)
    pods = [pod("chat-replica-0", h, first_ready=SERVED), unready("chat-replica-1", h), waiting]
    assert [u.name for u in plan_reconcile(FLEET, spec(3), at(200, pods)).replaced] == ["chat-replica-1"]
    # one scheduled and pulling its image is on its way: it holds the replacement back
    pulling = replace(waiting, unschedulable=False)
    plan = plan_reconcile(FLEET, spec(3), at(200, [*pods[:2], pulling]))
    assert not plan.replaced and "chat-replica-2 is still starting" in str(degraded_of(plan)["message"])


def test_the_unhealthy_condition_is_stable_while_nothing_changes() -> None:
    h = template_hash(spec(2))
    pods = [unready("chat-replica-0", h), pod("chat-replica-1", h, ready=False, ready_changed=T0)]
    first = plan_reconcile(FLEET, spec(2), at(200, pods))
    later = plan_reconcile(FLEET, spec(2), at(260, pods, conditions=first.status["conditions"]))
    assert not first.replaced and degraded_of(first) == degraded_of(later)  # no status rewrite


def test_replicas_are_marked_the_first_time_they_are_seen_ready() -> None:
    h = template_hash(spec(3))
    pods = [pod("chat-replica-0", h), pod("chat-replica-1", h, first_ready=SERVED),
            pod("chat-replica-2", h, ready=False)]  # fmt: skip
    plan = plan_reconcile(FLEET, spec(3), state(pods))
    assert plan.mark_ready == ("chat-replica-0",) and not plan.is_noop


def test_observed_readiness_history_of_a_pod() -> None:
    body = {
        "metadata": {"name": "chat-replica-0", "annotations": {"prefixfleet.io/first-ready": SERVED}},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": T0}],
            "containerStatuses": [
                {"name": "sidecar", "state": {"running": {"startedAt": "2025-12-31T22:00:01Z"}}},
                {"name": "engine", "state": {"running": {"startedAt": "2025-12-31T22:00:02Z"}}},
            ],
        },
    }
    observed = observe_pod(body)
    assert (observed.ready_changed, observed.first_ready) == (T0, SERVED)
    assert observed.engine_started == "2025-12-31T22:00:02Z"
    assert observed.was_ready and observed.lapsed
    assert not observed.engine_down
    fresh = observe_pod({"metadata": {"name": "x"}, "status": {"phase": "Pending"}})
    assert (fresh.ready_changed, fresh.first_ready, fresh.engine_started) == ("", "", "")
    assert not fresh.was_ready and not fresh.lapsed and not fresh.engine_down
    engine = body["status"]["containerStatuses"][1]  # type: ignore[index]
    engine["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    backoff = observe_pod(body)
    assert backoff.engine_down and backoff.engine_started == ""
    assert not backoff.unschedulable
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pending = observe_pod(
        {"metadata": {"name": "x"}, "status": {"phase": "Pending", "conditions": [unschedulable]}}
    )
    assert pending.unschedulable


# The allowance is counted on the operator's clock, from the first time it saw the pod unready (the
# prefixfleet.io/unready-seen mark, kept on the pod across operator restarts): the Ready condition's
# lastTransitionTime is the node's clock, which may run behind or ahead of the operator's.


def test_a_node_clock_running_behind_does_not_get_a_hung_replica_replaced_at_once() -> None:
    h = template_hash(spec(2))
    # the node is an hour behind: the kubelet says unready "since an hour before" the operator's now
    behind = unready("chat-replica-1", h, since="2025-12-31T23:00:00Z", unready_seen="")
    observed = at(0, [pod("chat-replica-0", h, first_ready=SERVED), behind])
    first = plan_reconcile(FLEET, spec(2), observed)
    assert not first.replaced and first.recheck_after_s == 120.0  # the whole allowance, from now
    (mark,) = first.mark_unready
    assert mark[0] == "chat-replica-1" and not first.is_noop
    assert json.loads(mark[1]) == {"at": "2026-01-01T00:00:00Z", "readyChanged": "2025-12-31T23:00:00Z"}
    marked = apply(first, observed)
    assert not plan_reconcile(FLEET, spec(2), replace(marked, now=NOW + timedelta(seconds=119))).replaced
    plan = plan_reconcile(FLEET, spec(2), replace(marked, now=NOW + timedelta(seconds=120)))
    assert [(u.name, u.seconds, u.since) for u in plan.replaced] == [("chat-replica-1", 120.0, T0)]
    assert not plan.mark_unready  # marked once per stretch


def test_a_node_clock_running_ahead_does_not_delay_the_replacement() -> None:
    h = template_hash(spec(2))
    # an hour ahead: by the kubelet's time the pod turns unready an hour from now
    ahead = unready("chat-replica-1", h, since="2026-01-01T01:00:00Z", unready_seen="")
    observed = apply(plan_reconcile(FLEET, spec(2), at(0, [ahead])), at(0, [ahead]))
    plan = plan_reconcile(FLEET, spec(2), replace(observed, now=NOW + timedelta(seconds=121)))
    assert [u.name for u in plan.replaced] == ["chat-replica-1"]


def test_an_unready_seen_mark_later_than_now_is_no_mark_and_is_stamped_afresh() -> None:
    # a hand edit, or a writer whose clock ran ahead: counting from it would hold the replacement
    # back until that time (forever, for a far one)
    h = template_hash(spec(2))
    future = unready("chat-replica-1", h, unready_seen="2100-01-01T00:00:00Z")
    assert unready_since(future, NOW) is None
    assert unready_since(replace(future, unready_seen=T0), NOW) == NOW  # now itself is readable
    observed = at(30, [pod("chat-replica-0", h, first_ready=SERVED), future])
    first = plan_reconcile(FLEET, spec(2), observed)
    assert not first.replaced and first.recheck_after_s == 120.0  # the whole allowance, from now
    assert [(name, json.loads(mark)["at"]) for name, mark in first.mark_unready] == [
        ("chat-replica-1", "2026-01-01T00:00:30Z")
    ]
    marked = apply(first, observed)
    plan = plan_reconcile(FLEET, spec(2), replace(marked, now=NOW + timedelta(seconds=150)))
    assert [(u.name, u.seconds) for u in plan.replaced] == [("chat-replica-1", 120.0)]
    # one nothing replaces is reported from now, not from the future
    off = plan_reconcile(FLEET, spec(2, replaceUnreadyAfterSeconds=0), observed)
    assert [(u.name, u.since, u.first_seen) for u in off.unavailable] == [
        ("chat-replica-1", "2026-01-01T00:00:30Z", True)
    ]
    assert [name for name, _ in off.mark_unready] == ["chat-replica-1"]


def test_the_unready_seen_mark_belongs_to_one_unready_stretch() -> None:
    def body(ready: str, changed: str, mark: str) -> dict[str, object]:
        return {
            "metadata": {"name": "chat-replica-0", "annotations": {"prefixfleet.io/unready-seen": mark}},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": changed}],
            },
        }

    mark = unready_mark(NOW, T0)
    assert observe_pod(body("False", T0, mark)).unready_seen == "2026-01-01T00:00:00Z"
    # Ready since, and unready again: a new stretch, whatever the old mark said
    assert observe_pod(body("False", "2026-01-01T00:10:00Z", mark)).unready_seen == ""
    assert observe_pod(body("True", T0, mark)).unready_seen == ""
    for broken in ("", "yesterday", "[1]", '{"at": "2026-01-01T00:00:00Z"}', "[" * 100_000):
        assert observe_pod(body("False", T0, broken)).unready_seen == ""
    # a mark of this stretch the operator wrote before a restart still counts
    h = template_hash(spec(1))
    seen = replace(observe_pod(body("False", T0, mark)), template_hash=h, first_ready=SERVED)
    assert [u.name for u in plan_reconcile(FLEET, spec(1), at(120, [seen])).replaced] == ["chat-replica-0"]


def test_no_mark_is_written_for_a_pod_loading_its_model_that_no_knob_would_replace() -> None:
    h = template_hash(spec(1))
    loading = unready("chat-replica-0", h, first_ready="", unready_seen="")  # never Ready, knob off
    assert plan_reconcile(FLEET, spec(1), at(5, [loading])).is_noop
    # (a hung replica with replacing off is marked: it is reported, from the operator's first sighting)


# A replica that served, is unready now, and that nothing replaces (replaceUnreadyAfterSeconds: 0, or
# an unready time no allowance can be counted from; the kubelet not restarting its engine) serves
# nothing and holds its GPU: the fleet is Degraded (reason ReplicaUnavailable) while it lasts, with
# one Warning Event ReplicaUnavailable per pod per unready stretch, instead of looking healthy one short.


def test_a_hung_replica_nothing_replaces_makes_the_fleet_degraded_once_per_stretch() -> None:
    h = template_hash(spec(2))
    s = spec(2, replaceUnreadyAfterSeconds=0)
    hung = unready("chat-replica-1", h, unready_seen="")  # the kubelet turned it unready at T0
    observed = at(5, [pod("chat-replica-0", h, first_ready=SERVED), hung])
    first = plan_reconcile(FLEET, s, observed)
    assert not first.replaced and not first.delete_pods and not first.create_pods  # kept: replacing is off
    # marked like any tracked stretch: "since" is the operator's first sighting, not the node's clock
    assert [(name, json.loads(mark)["at"]) for name, mark in first.mark_unready] == [
        ("chat-replica-1", "2026-01-01T00:00:05Z")
    ]
    (event,) = first.events
    assert (event.type, event.reason) == ("Warning", "ReplicaUnavailable")
    assert "pod chat-replica-1 was Ready, is unready since 2026-01-01T00:00:05Z" in event.message
    assert "spec.engine.replaceUnreadyAfterSeconds is 0" in event.message
    degraded = degraded_of(first)
    assert (degraded["status"], degraded["reason"]) == ("True", "ReplicaUnavailable")
    assert degraded["message"] == (
        "no replacement coming: chat-replica-1 unready after serving since 2026-01-01T00:00:05Z"
        " (spec.engine.replaceUnreadyAfterSeconds is 0)"
    )

    # later rounds (and a restarted operator: the mark is on the pod) say nothing new and keep the
    # condition as it is: no Event per reconcile, no status rewrite
    marked = apply(first, observed)
    later = plan_reconcile(FLEET, s, replace(marked, now=NOW + timedelta(hours=1)))
    assert later.is_noop and not later.events and degraded_of(later) == degraded


def test_a_fleet_short_only_of_unavailable_replicas_is_not_progressing() -> None:
    h = template_hash(spec(2))
    s = spec(2, replaceUnreadyAfterSeconds=0)
    healthy = pod("chat-replica-0", h, first_ready=SERVED)
    plan = plan_reconcile(FLEET, s, at(60, [healthy, unready("chat-replica-1", h)]))
    progressing = next(c for c in plan.status["conditions"] if c["type"] == "Progressing")
    # nothing is under way: a `kubectl wait --for=condition=Progressing=false` ends, Degraded says why
    assert (progressing["status"], progressing["reason"]) == ("False", "ReplicaUnavailable")
    assert progressing["message"] == "1/2 replicas ready, no replacement coming"
    # a replica still loading next to it: the fleet is still waiting for that one
    loading = unready("chat-replica-2", h, first_ready="")
    plan = plan_reconcile(
        FLEET, spec(3, replaceUnreadyAfterSeconds=0), at(60, [healthy, unready("chat-replica-1", h), loading])
    )
    progressing = next(c for c in plan.status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "WaitingForReplicas")


def test_the_unavailable_condition_clears_when_the_replica_is_ready_again_or_gone() -> None:
    h = template_hash(spec(2))
    s = spec(2, replaceUnreadyAfterSeconds=0)
    healthy = pod("chat-replica-0", h, first_ready=SERVED)
    hung = unready("chat-replica-1", h)
    down = plan_reconcile(FLEET, s, at(60, [healthy, hung]))
    assert degraded_of(down)["reason"] == "ReplicaUnavailable"
    prev = down.status["conditions"]

    recovered = replace(hung, ready=True, ready_changed="2026-01-01T00:02:00Z")
    up = plan_reconcile(FLEET, s, at(120, [healthy, recovered], conditions=prev))
    assert (degraded_of(up)["status"], degraded_of(up)["reason"]) == ("False", "AsExpected")
    assert not up.events
    gone = plan_reconcile(FLEET, s, at(120, [healthy], conditions=prev))
    assert degraded_of(gone)["status"] == "False"

    # hung again later: a new stretch (the old mark's readyChanged no longer matches), a new Event
    again = observe_pod(
        {
            "metadata": {
                "name": "chat-replica-1",
                "annotations": {
                    "prefixfleet.io/first-ready": SERVED,
                    "prefixfleet.io/unready-seen": unready_mark(NOW, T0),
                    "prefixfleet.io/template-hash": h,
                },
            },
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:05:00Z"}
                ],
            },
        }
    )
    plan = plan_reconcile(FLEET, s, at(300, [healthy, again], conditions=up.status["conditions"]))
    assert [e.reason for e in plan.events] == ["ReplicaUnavailable"]
    assert "since 2026-01-01T00:05:00Z" in str(degraded_of(plan)["message"])


def test_a_replica_with_a_replacement_coming_is_not_reported_unavailable() -> None:
    h = template_hash(spec(2))
    healthy = pod("chat-replica-0", h, first_ready=SERVED)
    # the default knob (120 s) replaces it: within the allowance nothing is said, as before
    hung = unready("chat-replica-1", h)
    early = plan_reconcile(FLEET, spec(2), at(60, [healthy, hung]))
    assert early.is_noop and not early.events and degraded_of(early)["status"] == "False"
    over = plan_reconcile(FLEET, spec(2), at(130, [healthy, hung]))
    assert [e.reason for e in over.events] == ["ReplicaUnhealthy"]
    assert degraded_of(over)["reason"] == "ReplicaUnhealthy"
    # replacing off, but the kubelet restarted its engine (a crash: loading again): it comes back itself
    restarted = unready("chat-replica-1", h, engine_started="2026-01-01T00:00:05Z")
    plan = plan_reconcile(FLEET, spec(2, replaceUnreadyAfterSeconds=0), at(60, [healthy, restarted]))
    assert not plan.events and degraded_of(plan)["status"] == "False"
    # a pod that never served is loading, not unavailable
    loading = unready("chat-replica-1", h, first_ready="")
    plan = plan_reconcile(FLEET, spec(2, replaceUnreadyAfterSeconds=0), at(60, [healthy, loading]))
    assert not plan.events and degraded_of(plan)["status"] == "False"
    # one the reconcile removes anyway (a scale-down takes an unready pod first) is not reported
    plan = plan_reconcile(FLEET, spec(1, replaceUnreadyAfterSeconds=0), at(60, [healthy, hung]))
    assert [d.name for d in plan.delete_pods] == ["chat-replica-1"]
    assert [e.reason for e in plan.events] == ["DeletingReplica"] and degraded_of(plan)["status"] == "False"


# Any shape of unready pod: served or not, a readable transition time or not, its engine restarted
# or down or not, Running or not, draining, terminating; the knobs on or off.
unready_pods = st.builds(
    lambda i, ready, served, changed, engine, phase, draining, terminating, seen: ObservedPod(
        name=f"chat-replica-{i}",
        phase=phase,
        ready=ready,
        terminating=terminating,
        draining_since=T0 if draining else "",
        first_ready=SERVED if served else "",
        ready_changed=changed,
        unready_seen=seen,
        engine_started=engine if engine != "down" else "",
        engine_down=engine == "down",
    ),
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
    st.sampled_from([T0, "", "garbage"]),
    st.sampled_from(["", "down", "2025-12-31T23:30:00Z", "2026-01-01T00:00:05Z"]),
    st.sampled_from(["Running", "Pending", "Unknown"]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([T0, "", "2100-01-01T00:00:00Z"]),
)


@given(
    st.lists(unready_pods, max_size=4, unique_by=lambda p: p.name),
    st.sampled_from([0, 60]),
    st.sampled_from([0, 60]),
    st.integers(0, 300),
)
def test_the_plan_reports_unavailable_exactly_the_replicas_that_stay_unavailable(
    pods: list[ObservedPod], unready_after_s: int, never_ready_after_s: int, seconds: int
) -> None:
    plan = plan_unhealthy(pods, NOW + timedelta(seconds=seconds), unready_after_s, never_ready_after_s)
    expected = [p.name for p in pods if stays_unavailable(p, unready_after_s, never_ready_after_s)]
    assert [u.name for u in plan.unavailable] == expected
    # and no replica is both unavailable and counted against an allowance
    assert not {u.name for u in plan.unavailable} & {u.name for u in plan.overdue}


def test_while_the_spec_is_invalid_every_hung_replica_is_unavailable_whatever_the_knobs() -> None:
    # an invalid spec stops every plan, replacements too: a replica that served and is unready stays
    # so until the spec is fixed (prefixfleet_operator_unavailable_replicas keeps counting it)
    h = template_hash(spec(2))
    pods = [
        pod("chat-replica-0", h, first_ready=SERVED),  # serving
        unready("chat-replica-1", h),  # hung: the default knob would have replaced it in 120 s
        unready("chat-replica-2", h, engine_started="2026-01-01T00:00:05Z"),  # restarted: loading again
        unready("chat-replica-3", h, first_ready=""),  # never served: loading
        unready("chat-replica-4", h, draining_since=T0),  # on its way out
        unready("chat-replica-5", h, since="", unready_seen=""),  # hung, no readable unready time
    ]
    assert unavailable_while_invalid(pods) == ("chat-replica-1", "chat-replica-5")
    assert unavailable_while_invalid([]) == ()


def test_a_hung_replica_without_a_readable_unready_time_is_reported_without_one() -> None:
    h = template_hash(spec(2))
    healthy = pod("chat-replica-0", h, first_ready=SERVED)
    # no transition time to count an allowance from, so even the default knob cannot replace it
    unknown = unready("chat-replica-1", h, since="", unready_seen="")
    plan = plan_reconcile(FLEET, spec(2), at(60, [healthy, unknown]))
    assert not plan.replaced and not plan.mark_unready  # no stretch to tie a mark (or an Event) to
    assert not plan.events
    degraded = degraded_of(plan)
    assert degraded["reason"] == "ReplicaUnavailable"
    assert "chat-replica-1 unready after serving since an unknown time" in str(degraded["message"])
    assert "no readable transition time" in str(degraded["message"])


# Pods an older operator created carry no first-ready mark; one unready at the upgrade (or Ready and
# unready again while no operator ran) still served if the kubelet's Ready condition says so: it is
# written False when the pod starts, and its lastTransitionTime moves only when its status changes.


def upgraded(ready_changed: str, started: str = "2025-12-31T22:00:00Z") -> dict[str, object]:
    """An unready pod without the first-ready mark, as the kubelet reports it."""
    return {
        "metadata": {"name": "chat-replica-0", "creationTimestamp": "2025-12-31T21:59:58Z"},
        "status": {
            "phase": "Running",
            "startTime": started,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ready_changed}],
            "containerStatuses": [
                {"name": "engine", "state": {"running": {"startedAt": "2025-12-31T22:00:01Z"}}},
            ],
        },
    }


def test_a_pod_unready_since_long_after_it_started_served_mark_or_not() -> None:
    h = template_hash(spec(1))
    hung = replace(observe_pod(upgraded(T0)), template_hash=h, unready_seen=T0)
    assert hung.was_ready and hung.lapsed and not hung.first_ready
    plan = plan_reconcile(FLEET, spec(1), at(120, [hung]))
    assert [(u.name, u.reason) for u in plan.replaced] == [("chat-replica-0", "unready")]


def test_a_pod_unready_since_it_started_never_served_and_is_left_to_load() -> None:
    h = template_hash(spec(1))
    # the kubelet wrote Ready=False as it started the pod (within a second or two): loading
    for changed in ("2025-12-31T22:00:00Z", "2025-12-31T22:00:02Z", "2025-12-31T22:00:10Z"):
        loading = replace(observe_pod(upgraded(changed)), template_hash=h, unready_seen=T0)
        assert not loading.was_ready and not loading.lapsed, changed
        assert plan_reconcile(FLEET, spec(1), at(10**5, [loading])).is_noop
    # no readable startTime: no evidence, so never Ready (a guess would replace a loading pod)
    for started in ("", "soon"):
        unknown = observe_pod(upgraded(T0, started=started))
        assert not unknown.was_ready
