"""The operator autoscaler's view of a fleet, from plain data (no I/O).

Specification:
* the planner's policy comes from spec.autoscaling and spec.prewarm (pre-warm off → plain prefix_aware);
* an engine's prompt/cached token counters are read from a Prometheus exposition; absent → None;
* prefill load = growth of uncached prompt tokens per second / the engine's prefill speed; a counter
  reset counts its new value; one sample alone is no load;
* a pod's phase: draining (marked), starting (not Ready), warming (annotation or its sidecar), ready;
* replicas the spec wants but whose pods do not exist yet are `starting`;
* a pod that served and is unready now (hung) is no capacity: it is not observed (nor its stale load
  record, nor the subtrees it holds); its slot is `starting`, the replacement the reconcile creates;
* unless no replacement is coming (replaceUnreadyAfterSeconds: 0): then it is unavailable, neither
  serving nor starting; the planner plans the rest of the fleet, its maxReplicas lowered by the pods
  unavailable, and the scale adds their slots back, so the fleet makes up for them within min/max;
* status.hotPrefixes carries hashes, token counts, rounded rates and holders, at most 8;
* warm sources: each subtree from a reachable holder other than the target, grouped by holder.
"""

from __future__ import annotations

from dataclasses import replace

from prefixfleet.operator.autoscale import ScalePlan, SubtreeObservation, plan_scale
from prefixfleet.operator.autoscale_observe import (
    EngineReading,
    TokenCounters,
    hot_prefixes_status,
    observe_fleet,
    parse_token_counters,
    prefill_load_of,
    rates_between,
    replica_phase,
    scale_policy,
    unavailable_replicas,
    with_unavailable,
)
from prefixfleet.operator.models import FleetSpec, validate_spec
from prefixfleet.operator.planner import ObservedPod
from prefixfleet.router.prewarm import warm_sources
from prefixfleet.router.records import LoadReport

SPEC = {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 2}


def load(state: str = "ready", pending: int = 0, speed: float = 1000.0, in_flight: int = 0) -> LoadReport:
    return LoadReport(seq=1, ts=0.0, state=state, engine_ok=True, in_flight=in_flight, queued=0,
                      pending_prefill_tokens=pending, prefill_tokens_per_s=speed, cached_tokens=10,
                      capacity_tokens=100, summary_version=1)  # fmt: skip


def test_policy_from_the_spec() -> None:
    spec = validate_spec({**SPEC, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3,
                          "targetTTFTSeconds": 0.5, "targetLoad": 0.6, "scaleDownLoad": 0.3,
                          "leadTimeSeconds": 5, "maxStepUp": 1, "hotRateRps": 2},
                          "prewarm": {"topSubtrees": 3}})  # fmt: skip
    policy = scale_policy(spec)
    assert (policy.mode, policy.min_replicas, policy.max_replicas, policy.target_ttft_s) == (
        "prefix_aware_prewarm", 1, 3, 0.5)  # fmt: skip
    assert (policy.target_load, policy.scale_down_load, policy.lead_time_s) == (0.6, 0.3, 5.0)
    assert (policy.max_step_up, policy.hot_rate_rps, policy.prewarm_subtrees) == (1, 2.0, 3)
    off = validate_spec({**SPEC, "prewarm": {"enabled": False}})
    assert scale_policy(off).mode == "prefix_aware"


def test_token_counters_from_an_exposition() -> None:
    text = (
        "# TYPE sglang:prompt_tokens counter\n"
        'sglang:prompt_tokens_total{model_name="m"} 1200.0\n'
        "# TYPE sglang:cached_tokens counter\n"
        'sglang:cached_tokens_total{model_name="m"} 200.0\n'
        "# TYPE prefixfleet_sidecar_x gauge\nprefixfleet_sidecar_x 3\n"
    )
    counters = parse_token_counters(text, 5.0)
    assert counters == TokenCounters(5.0, 1200.0, 200.0) and counters.uncached_tokens == 1000.0
    assert parse_token_counters("# nothing here\n", 5.0) is None
    assert parse_token_counters("not { a metric", 5.0) is None


def test_prefill_load_is_uncached_growth_over_prefill_speed() -> None:
    before, after = TokenCounters(0.0, 1000.0, 0.0), TokenCounters(2.0, 3000.0, 1000.0)
    rates = rates_between(before, after)
    assert prefill_load_of(rates, 500.0) == 1.0  # 1000 uncached tokens in 2 s at 500 tok/s
    assert rates_between(None, after) is None and prefill_load_of(None, 500.0) == 0.0
    assert prefill_load_of(rates, 0.0) == 0.0
    restarted = TokenCounters(2.0, 400.0, 0.0)
    assert prefill_load_of(rates_between(before, restarted), 100.0) == 2.0  # the new value is the growth
    # per replica, with each one's own prefill speed; a replica without a load record has none
    assert rates is not None
    reading = EngineReading({"a": rates, "b": rates}, {}, "scrape", "")
    assert reading.prefill_loads({"a": load(speed=500.0)}) == {"a": 1.0}


def test_replica_phases() -> None:
    ready = ObservedPod("p", phase="Running", ready=True)
    assert replica_phase(ready, load()) == "ready"
    assert replica_phase(ObservedPod("p", phase="Pending"), None) == "starting"
    assert replica_phase(ObservedPod("p", ready=True, state="warming"), load()) == "warming"
    assert replica_phase(ready, load(state="warming")) == "warming"
    assert (
        replica_phase(ObservedPod("p", ready=True, draining_since="2026-01-01T00:00:00Z"), load())
        == "draining"
    )


def test_observation_counts_pods_still_to_come_as_starting() -> None:
    pods = [
        ObservedPod("a", phase="Running", ready=True, created="2026-01-01T00:00:00Z"),
        ObservedPod("b", phase="Running", ready=True, draining_since="2026-01-01T00:00:01Z"),
        ObservedPod("c", phase="Failed"),
    ]
    observed = observe_fleet(100.0, 2, pods, {"a": load(pending=500, in_flight=2)}, {"a": 0.8}, ())
    by_id = {r.replica_id: r for r in observed.replicas}
    assert set(by_id) == {"a", "b", "pending-0"}  # the failed pod is gone; one more is on its way
    assert by_id["a"].est_wait_s == 0.5 and by_id["a"].in_flight == 2 and by_id["a"].prefill_load == 0.8
    assert by_id["b"].phase == "draining" and by_id["pending-0"].phase == "starting"


SERVED = "2026-01-01T00:00:00Z"  # the operator's first-ready mark


def test_a_replica_that_served_and_hung_is_no_capacity_its_replacement_is() -> None:
    pods = [
        ObservedPod("a", phase="Running", ready=True, first_ready=SERVED),
        # hung: unready after serving; its sidecar's last load record still says it is busy
        ObservedPod("b", phase="Running", ready=False, first_ready=SERVED, ready_changed=SERVED),
        ObservedPod("c", phase="Running", ready=False),  # never Ready yet: loading its model
    ]
    loads = {"a": load(), "b": load(pending=9000, in_flight=5), "c": load()}
    observed = observe_fleet(100.0, 3, pods, loads, {"a": 0.2, "b": 0.9}, ())
    by_id = {r.replica_id: r for r in observed.replicas}
    assert set(by_id) == {"a", "c", "pending-0"}
    assert by_id["c"].phase == "starting" and by_id["pending-0"].phase == "starting"
    assert by_id["pending-0"].in_flight == 0 and by_id["pending-0"].prefill_load == 0.0
    # the planner still counts spec.replicas slots, so the scales it plans keep their size
    assert sum(r.phase != "draining" for r in observed.replicas) == 3


def test_a_hung_replica_being_drained_stays_draining() -> None:
    hung = ObservedPod("b", ready=False, first_ready=SERVED, draining_since=SERVED)
    observed = observe_fleet(100.0, 1, [hung], {}, {}, ())
    assert {r.replica_id: r.phase for r in observed.replicas} == {"b": "draining", "pending-0": "starting"}


def test_hot_subtrees_held_only_by_a_hung_replica_are_starved_not_on_their_way() -> None:
    # Observed as `starting`, the hung holder made its hot subtrees look like help on its way, so an
    # idle replica was never warmed with them. Left out, they are starved and get a helper.
    spec = validate_spec({**SPEC, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2,
                          "hotRateRps": 0.1}, "prewarm": {"topSubtrees": 2}})  # fmt: skip
    pods = [
        ObservedPod("a", phase="Running", ready=True, first_ready=SERVED),
        ObservedPod("b", phase="Running", ready=False, first_ready=SERVED, ready_changed=SERVED),
    ]
    hot = SubtreeObservation("00000000000000aa", tokens=4096, rate_rps=5.0, holders=frozenset({"b"}))
    observed = observe_fleet(100.0, 2, pods, {"a": load(), "b": load()}, {}, (hot,))
    plan = plan_scale(observed, scale_policy(spec))
    assert [(w.target, w.subtree_ids) for w in plan.prewarm] == [("a", ("00000000000000aa",))]


HUNG = ObservedPod("b", phase="Running", ready=False, first_ready=SERVED, ready_changed=SERVED,
                   unready_seen=SERVED, created="2026-01-01T00:00:00Z")  # fmt: skip


def autoscaled(replicas: int, low: int, high: int, **engine: object) -> FleetSpec:
    bounds = {"enabled": True, "minReplicas": low, "maxReplicas": high}
    return validate_spec(
        {**SPEC, "replicas": replicas, "engine": {"kind": "emulator", **engine}, "autoscaling": bounds}
    )


def scaled(spec: FleetSpec, pods: list[ObservedPod], prefill_loads: dict[str, float]) -> ScalePlan:
    """One round as the operator's autoscaler plays it (autoscale_handlers.autoscale_round)."""
    unavailable = unavailable_replicas(pods, spec)
    loads = {p.name: load() for p in pods}
    observed = observe_fleet(100.0, spec.replicas, pods, loads, prefill_loads, (), None, unavailable)
    return with_unavailable(plan_scale(observed, scale_policy(spec, len(unavailable))), unavailable)


def test_a_hung_replica_nothing_replaces_is_unavailable_not_starting() -> None:
    off = autoscaled(2, 1, 4, replaceUnreadyAfterSeconds=0)
    assert unavailable_replicas([HUNG], off) == ("b",)
    assert unavailable_replicas([HUNG], autoscaled(2, 1, 4)) == ()  # replaced after 120 s: its slot starts
    restarted = replace(HUNG, engine_started="2026-01-01T00:00:05Z")  # the kubelet restarted its engine
    assert unavailable_replicas([restarted], off) == ()
    loading = replace(HUNG, first_ready="")  # never Ready: starting, not hung
    assert unavailable_replicas([loading], off) == ()
    pods = [ObservedPod("a", phase="Running", ready=True, first_ready=SERVED), HUNG]
    observed = observe_fleet(100.0, 2, pods, {"a": load()}, {}, (), None, ("b",))
    assert [(r.replica_id, r.phase) for r in observed.replicas] == [("a", "ready")]  # no slot on its way


def test_the_fleet_makes_up_for_a_replica_nothing_replaces() -> None:
    ready = ObservedPod("a", phase="Running", ready=True, first_ready=SERVED, created="2026-01-01T00:00:00Z")
    # the load needs two replicas; one of the two pods hung, and replacing is off: scale up to three
    # (before: its slot counted as starting, so the fleet stayed one short for ever)
    plan = scaled(autoscaled(2, 1, 4, replaceUnreadyAfterSeconds=0), [ready, HUNG], {"a": 1.3})
    assert (plan.add, plan.desired_replicas) == (1, 3)
    assert "no replacement coming: b" in plan.reason
    # with replacement on, its slot is the replacement on its way: nothing to add
    assert scaled(autoscaled(2, 1, 4), [ready, HUNG], {"a": 1.3}).add == 0
    # minReplicas counts replicas that can serve: one serving of min 2 -> a third pod
    plan = scaled(autoscaled(2, 2, 4, replaceUnreadyAfterSeconds=0), [ready, HUNG], {"a": 0.1})
    assert (plan.add, plan.desired_replicas) == (1, 3)
    # a hung pod is a pod: maxReplicas bounds them all
    at_most = scaled(autoscaled(2, 1, 2, replaceUnreadyAfterSeconds=0), [ready, HUNG], {"a": 1.3})
    assert (at_most.add, at_most.desired_replicas) == (0, 2)
    assert scale_policy(autoscaled(2, 2, 2), unavailable=2).max_replicas == 0


def test_hot_prefixes_status_and_warm_sources() -> None:
    subtrees = [
        SubtreeObservation(f"{i:016x}", tokens=64 * i, rate_rps=1.234 * i, holders=frozenset({"a", "b"}))
        for i in range(1, 11)
    ]
    status = hot_prefixes_status(subtrees)
    assert len(status) == 8
    assert status[0] == {"hash": "0000000000000001", "tokens": 64, "rate": 1.2, "holders": ["a", "b"]}
    urls = {"a": "http://a", "b": "http://b", "new": "http://new"}
    assert warm_sources(["0000000000000001", "0000000000000002"], subtrees, urls, exclude="a") == {
        "http://b": ["0000000000000001", "0000000000000002"]
    }
    assert warm_sources(["ffffffffffffffff"], subtrees, urls) == {}  # nobody holds it: nothing to copy
