"""A worker whose summary is missing for a round does not have its past hits counted again.

A sidecar's summary expires when it cannot reach Redis for a while, and is gone after a Redis restart
until written again; the worker itself goes on, its hit counters with it. ``hot_subtrees`` dropped
the counters of every worker without a summary in the round, so when the summary came back each
counter (every hit since the sidecar started) was read as that round's increment: a prefix served at
2 requests/s for an hour showed ~270 in ``status.hotPrefixes[].rate`` (10 s rounds, 15 s half-life)
and that rate drove pre-warm and victim choices for minutes.
The autoscalers (operator and local fleet) now pass the workers there are (``workers``); a worker
that is gone is still forgotten.
"""

from __future__ import annotations

import pytest

from prefixfleet.operator.hot_subtrees import hot_subtrees
from prefixfleet.router.summary import HotNode, make_summary

HL = 15.0


def summary(worker: str, hits: int):
    return make_summary(
        worker=worker, version=1, generated_at=0.0, block_tokens=16, identity_seed=0,
        cached_tokens=0, capacity_tokens=1000, blocks={1}, hot=[HotNode(1, 800, hits, 0.0)],
    )  # fmt: skip


def rounds(*, workers: set[str] | None) -> float:
    """A worker serving 2 requests/s through one node for an hour, its summary missing one round."""
    _, state = hot_subtrees({"a": summary("a", 7200)}, None, now=0.0, half_life_s=HL, workers=workers)
    _, state = hot_subtrees({"a": summary("a", 7220)}, state, now=10.0, half_life_s=HL, workers=workers)
    _, state = hot_subtrees({}, state, now=20.0, half_life_s=HL, workers=workers)  # expired
    subs, _ = hot_subtrees({"a": summary("a", 7260)}, state, now=30.0, half_life_s=HL, workers=workers)
    (only,) = subs
    return only.rate_rps


def test_hits_served_before_a_missing_summary_are_not_counted_again() -> None:
    kept = rounds(workers={"a"})
    assert kept < 2.0  # 40 hits in the last 20 s, decaying up from nothing
    # callers that pass no workers (the simulator) forget the worker: its return is a first sight,
    # whose counters are recorded, not counted (read as one round's they were > 100/s until the
    # first-sight rule, tests/test_hot_subtrees.py): only the rate from before decays
    assert 0.0 < rounds(workers=None) < kept - 1.0


def test_a_worker_that_is_gone_is_still_forgotten() -> None:
    s0 = {"a": summary("a", 10), "b": summary("b", 10)}
    _, state = hot_subtrees(s0, None, now=0.0, workers={"a", "b"})
    _, state = hot_subtrees({"a": summary("a", 20)}, state, now=5.0, workers={"a"})
    assert ("b", 1) not in state.hits and ("a", 1) in state.hits


def test_a_restarted_worker_counts_its_new_counter_after_a_missing_summary() -> None:
    _, state = hot_subtrees({"a": summary("a", 7200)}, None, now=0.0, workers={"a"})
    _, state = hot_subtrees({}, state, now=10.0, workers={"a"})
    subs, _ = hot_subtrees({"a": summary("a", 30)}, state, now=20.0, half_life_s=10.0, workers={"a"})
    # the counter went down: reset, its whole new value is the increment (3/s over 10 s)
    assert subs[0].rate_rps == pytest.approx(0.5 * 3.0)
