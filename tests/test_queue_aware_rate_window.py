"""queue_aware combines a sidecar's reported rates with its own sends over the sidecar's window.

A load record's ``arrivals_per_s`` / ``write_tokens_per_s`` are DecayedRates over RATE_WINDOW_S
(10 s). queue_aware added its own sends since the record to it, and decayed the record, over its own
``window_s``: with ``--policy-param window_s=30`` (or 3) the sum was neither window's rate. One
gateway in front of a replica, 10 requests a second for 10 s, read 3 s after a record 3 s old:
window_s 30 read 1.11x and window_s 3 0.68x the rate the sidecar itself counted. Both terms are now
over RATE_WINDOW_S, so with one gateway the fleet rate is exactly what the sidecar counts.
"""

from __future__ import annotations

import pytest

from prefixfleet.router.policies import QueueAware, ReplicaState, RouteRequest
from prefixfleet.router.policies.base import RATE_WINDOW_S, DecayedRate, Decision

PROMPT = 1000


def _request(now: float) -> RouteRequest:
    return RouteRequest(tokens=b"\0" * 4 * PROMPT, num_tokens=PROMPT, now=now)


def _report(arrivals: DecayedRate, writes: DecayedRate, ts: float) -> ReplicaState:
    """Replica 0's load record at ``ts`` with the rates its sidecar counted (sends up to ``ts``)."""
    return ReplicaState(
        0,
        reported_arrivals_per_s=arrivals.rate(ts, RATE_WINDOW_S),
        reported_write_tokens_per_s=writes.rate(ts, RATE_WINDOW_S),
        reported_at=ts,
    )


@pytest.mark.parametrize("window_s", [3.0, RATE_WINDOW_S, 30.0])
def test_one_gateway_reads_what_its_sidecar_counts_whatever_its_window(window_s: float) -> None:
    policy = QueueAware(window_s=window_s)
    arrivals, writes = DecayedRate(), DecayedRate()  # what replica 0's sidecar counts
    record = _report(arrivals, writes, 0.0)
    policy.choose(_request(0.0), [record])  # a gateway scores a reporting replica before it sends
    for i in range(1, 101):  # 10 requests a second for 10 s, each writing 200 uncached tokens
        t = i / 10
        policy.on_routed(_request(t), Decision(0, "cache_hit", PROMPT - 200))
        arrivals.add(1.0, t, RATE_WINDOW_S)
        writes.add(200.0, t, RATE_WINDOW_S)
        if i == 70:
            record = _report(arrivals, writes, t)  # the gateway's latest record, from t = 7 s
    now = 13.0  # the 30 sends after the record are known to this gateway only
    assert policy.replica_arrival_rate(record, now) == pytest.approx(arrivals.rate(now, RATE_WINDOW_S))
    assert policy.write_rate(record, now) == pytest.approx(writes.rate(now, RATE_WINDOW_S))
    # the cache turnover (capacity / write rate) follows: 10,000 tokens at the sidecar's rate
    full = ReplicaState(
        0,
        capacity_tokens=10_000,
        reported_arrivals_per_s=record.reported_arrivals_per_s,
        reported_write_tokens_per_s=record.reported_write_tokens_per_s,
        reported_at=record.reported_at,
    )
    assert policy.turnover_s(full, now) == pytest.approx(10_000 / writes.rate(now, RATE_WINDOW_S))


def test_window_s_still_sets_the_own_count_of_a_replica_without_reports() -> None:
    # an unreported replica (a static worker, an older sidecar, the simulator) keeps window_s
    short, default = QueueAware(window_s=3.0), QueueAware()
    for i in range(1, 101):
        for policy in (short, default):
            policy.on_routed(_request(i / 10), Decision(0, "cache_hit", PROMPT))
    unreported = ReplicaState(0)
    own_short, own_default = DecayedRate(), DecayedRate()
    for i in range(1, 101):
        own_short.add(1.0, i / 10, 3.0)
        own_default.add(1.0, i / 10, RATE_WINDOW_S)
    assert short.replica_arrival_rate(unreported, 13.0) == pytest.approx(own_short.rate(13.0, 3.0))
    assert default.replica_arrival_rate(unreported, 13.0) == pytest.approx(
        own_default.rate(13.0, RATE_WINDOW_S)
    )
    assert own_short.rate(13.0, 3.0) < 0.8 * own_default.rate(13.0, RATE_WINDOW_S)  # window_s matters
