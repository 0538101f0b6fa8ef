"""queue_aware reads a replica's traffic from every gateway, not only its own.

Each gateway's queue_aware estimated a replica's arrival rate (its head-of-line delay charge) and
the rate of uncached tokens written to it (its cache-turnover / eviction charge) from its own sends.
With G gateways each sees about 1/G of a replica's traffic: the delay charge was G times too small
and caches looked G times slower to turn over. Sidecars now publish their worker's rates in the load
record (``arrivals_per_s``, ``write_tokens_per_s``); the gateway's view puts them in ReplicaState,
and the policy adds its own sends since the report's time.

Pure tests: the policy, the record's encoding and the view. tests/test_queue_aware_shared_rates_sidecar.py
runs a real sidecar publishing them.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from prefixfleet.router.policies import QueueAware, ReplicaState, RouteRequest
from prefixfleet.router.policies.base import RATE_WINDOW_S, DecayedRate, Decision
from prefixfleet.router.records import (
    LoadReport,
    decode_load,
    decode_load_push,
    encode_load_push,
    encode_record,
)
from prefixfleet.router.summary import SummaryError
from prefixfleet.router.view import FleetView

TOKENS = 4000


def _request(now: float, num_tokens: int = TOKENS) -> RouteRequest:
    return RouteRequest(tokens=b"\0" * 4 * num_tokens, num_tokens=num_tokens, now=now)


class _Fleet:
    """G gateways' queue_aware in front of replica 0, one all-seeing queue_aware, and what replica
    0's sidecar counts (the same DecayedRate type the sidecar uses)."""

    def __init__(self, gateways: int) -> None:
        self.gateways = [QueueAware() for _ in range(gateways)]
        self.all_seeing = QueueAware()
        self.arrivals, self.writes = DecayedRate(), DecayedRate()
        self.n = 0
        # each gateway has scored replica 0 with a report before sending to it (as every send
        # follows a choose): from then on it keeps the sends the next report may not hold yet
        reporting = ReplicaState(0, reported_arrivals_per_s=0.0, reported_write_tokens_per_s=0.0)
        for policy in (*self.gateways, self.all_seeing):
            policy.choose(_request(0.0), [reporting])

    def send(self, now: float, uncached: int, gateway: int | None = None) -> None:
        """A request to replica 0 at ``now`` writing ``uncached`` tokens, through ``gateway``
        (default: the gateways in turn)."""
        g = self.n % len(self.gateways) if gateway is None else gateway
        self.n += 1
        request = _request(now)
        decision = Decision(0, "cache_hit", TOKENS - uncached)
        self.gateways[g].on_routed(request, decision)
        self.all_seeing.on_routed(request, decision)
        self.arrivals.add(1.0, now, RATE_WINDOW_S)
        self.writes.add(float(uncached), now, RATE_WINDOW_S)

    def reported(self, state: ReplicaState, ts: float) -> ReplicaState:
        return replace(
            state,
            reported_arrivals_per_s=self.arrivals.rate(ts, RATE_WINDOW_S),
            reported_write_tokens_per_s=self.writes.rate(ts, RATE_WINDOW_S),
            reported_at=ts,
        )


def _full(matched: int = 0, wait_s: float = 0.01) -> ReplicaState:
    """Replica 0 with a full cache: any uncached token evicts."""
    return ReplicaState(
        0, matched_tokens=matched, cached_tokens=100_000, capacity_tokens=100_000, wait_s=wait_s
    )


@pytest.mark.parametrize("gateways", [1, 2, 4])
def test_with_reported_rates_a_gateway_charges_what_one_seeing_all_traffic_would(gateways: int) -> None:
    fleet = _Fleet(gateways)
    for i in range(120):  # 12 requests a second for 10 s, spread over the gateways
        fleet.send(i / 12, uncached=500 if i % 3 else 3000)
    state = _full()
    with_report = fleet.reported(state, ts=10.0)  # the sidecar's report: every send above reached it
    for i in range(3):  # gateway 0 sends more after the report (the others' are not seen yet)
        fleet.send(10.05 + 0.05 * i, uncached=800, gateway=0)
    now = 10.2
    ours, truth = fleet.gateways[0], fleet.all_seeing
    # a copy (best match 2000 elsewhere, none here) overflows a full cache: the eviction charge is read
    request = _request(now)
    assert ours.replica_arrival_rate(with_report, now) == pytest.approx(truth.arrival_rate(0, now))
    assert ours.turnover_s(with_report, now) == pytest.approx(truth.turnover_s(state, now))
    assert ours.score(request, with_report, best_match=2000) == pytest.approx(
        truth.score(request, state, best_match=2000)
    )
    # without the report the gateway sees its own share only: what it charged before
    own_only = ours.arrival_rate(0, now)
    assert own_only == pytest.approx(truth.arrival_rate(0, now), rel=0.05 if gateways == 1 else 1.0)
    if gateways > 1:
        assert own_only < truth.arrival_rate(0, now) / gateways * 1.3
        assert ours.score(request, state, best_match=2000) < truth.score(request, state, best_match=2000)


def test_a_long_miss_leaves_the_busy_replica_as_an_all_seeing_gateway_would_send_it() -> None:
    fleet = _Fleet(3)
    for i in range(300):  # 30 requests a second at replica 0, a third of them through gateway 0
        fleet.send(i / 30, uncached=0)
    now = ts = 10.0
    busy = fleet.reported(ReplicaState(0, wait_s=0.0), ts)
    # replica 1: a little queue, no traffic (its sidecar reports none)
    quiet = ReplicaState(
        1, wait_s=0.04, reported_arrivals_per_s=0.0, reported_write_tokens_per_s=0.0, reported_at=ts
    )
    request = _request(now)
    truth = fleet.all_seeing.choose(request, [replace(busy, reported_arrivals_per_s=None), quiet])
    assert truth.replica_id == 1  # 30 req/s queue behind the 0.13 s prefill: worth the 40 ms wait
    ours = fleet.gateways[0]
    assert ours.choose(request, [busy, quiet]).replica_id == 1
    # before: its own 10 req/s made the delay look small enough to take the busy replica
    unreported = [replace(busy, reported_arrivals_per_s=None, reported_write_tokens_per_s=None), quiet]
    assert ours.choose(request, unreported).replica_id == 0


def test_sends_the_report_counts_are_not_counted_again() -> None:
    policy = QueueAware()
    state = ReplicaState(0, reported_arrivals_per_s=0.0, reported_write_tokens_per_s=0.0, reported_at=0.0)
    policy.choose(_request(0.0), [state])  # the policy learns replica 0 reports
    for t in (1.0, 2.0, 3.0):
        policy.on_routed(_request(t), Decision(0, "no_match", 0))
    # a report written at 2.5 holds the sends at 1 and 2 (rate 2 / window, decayed), not the one at 3
    sidecar = DecayedRate()
    for t in (1.0, 2.0):
        sidecar.add(1.0, t, RATE_WINDOW_S)
    report = replace(state, reported_arrivals_per_s=sidecar.rate(2.5, RATE_WINDOW_S), reported_at=2.5)
    # exactly the three sends: the own count, with one gateway
    assert policy.replica_arrival_rate(report, 4.0) == pytest.approx(policy.arrival_rate(0, 4.0))
    # a later report holding all three: still three
    sidecar.add(1.0, 3.0, RATE_WINDOW_S)
    later = replace(report, reported_arrivals_per_s=sidecar.rate(3.5, RATE_WINDOW_S), reported_at=3.5)
    assert policy.replica_arrival_rate(later, 4.0) == pytest.approx(policy.arrival_rate(0, 4.0))


def test_without_reported_rates_the_policy_counts_its_own_sends_as_before() -> None:
    policy = QueueAware()
    state = ReplicaState(0)
    policy.choose(_request(0.0), [state])
    for t in (1.0, 2.0):
        policy.on_routed(_request(t), Decision(0, "no_match", 1000))
    assert policy.replica_arrival_rate(state, 3.0) == policy.arrival_rate(0, 3.0) > 0
    assert policy.write_rate(state, 3.0) == pytest.approx(2 * 3000 / RATE_WINDOW_S, rel=0.2)
    policy.on_replica_removed(0)
    assert policy.replica_arrival_rate(state, 3.0) == 0.0


# -- the load record -------------------------------------------------------------------------------

_REPORT = LoadReport(
    seq=3,
    ts=1764489612.25,
    state="ready",
    engine_ok=True,
    in_flight=1,
    queued=0,
    pending_prefill_tokens=0,
    prefill_tokens_per_s=30000.0,
    cached_tokens=10,
    capacity_tokens=1000,
    summary_version=2,
    arrivals_per_s=4.25,
    write_tokens_per_s=1234.5,
)


def test_the_rates_round_trip_in_the_record_and_its_push() -> None:
    assert decode_load(encode_record(_REPORT)) == _REPORT
    assert decode_load_push(encode_load_push("w1", encode_record(_REPORT))).load == _REPORT


def test_a_record_of_an_older_sidecar_reads_as_not_reported() -> None:
    old = {k: v for k, v in json.loads(encode_record(_REPORT)).items() if not k.endswith("_per_s")}
    old["prefill_tokens_per_s"] = 30000.0
    load = decode_load(json.dumps(old))
    assert (load.arrivals_per_s, load.write_tokens_per_s) == (None, None)
    # and one built without them (null on the wire)
    assert decode_load(encode_record(replace(_REPORT, arrivals_per_s=None))).arrivals_per_s is None


@pytest.mark.parametrize("name", ["arrivals_per_s", "write_tokens_per_s"])
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"4"', "wrong type"),
        ("true", "wrong type"),
        ("-1", "must not be negative"),
        ("NaN", "finite"),
        ("Infinity", "finite"),
        ("1e400", "finite"),
        ("1e10", "above"),
    ],
)
def test_a_bad_rate_is_refused_naming_the_field(name: str, value: str, says: str) -> None:
    raw = encode_record(_REPORT).replace(f'"{name}":', f'"{name}":{value},"x":')
    with pytest.raises(SummaryError, match=f"'{name}'.*{says}|{says}.*'{name}'") as err:
        decode_load(raw)
    assert "load record" in str(err.value)


def test_the_view_hands_the_reported_rates_to_the_policy() -> None:
    view = FleetView()
    member = json.dumps({"url": "http://w1:1", "v": 1})
    view.apply_snapshot({"w1": member, "w2": member}, {"w1": encode_record(_REPORT)}, now=0.0)
    old = replace(_REPORT, arrivals_per_s=None, write_tokens_per_s=None)
    view.apply_load("w2", old, now=0.0)
    workers = [view.workers["w1"], view.workers["w2"]]
    rows = view.replica_states(workers, view.request_hashes(b"\0" * 64, None, workers), 16, _REPORT.ts)
    assert (rows[0].reported_arrivals_per_s, rows[0].reported_write_tokens_per_s) == (4.25, 1234.5)
    assert rows[0].reported_at == _REPORT.ts
    assert (rows[1].reported_arrivals_per_s, rows[1].reported_write_tokens_per_s) == (None, None)
    assert math.isfinite(QueueAware().score(_request(_REPORT.ts, 16), rows[0]))
