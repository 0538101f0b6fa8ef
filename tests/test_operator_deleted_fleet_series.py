"""A deleted fleet leaves no series in the operator's /metrics (docs/metrics.md). Specification:
* once the reconcile finds the fleet gone and the autoscaler's fleet handler sees it deleted, none of
  its series is left: the gauges, and the counters too (``scale_events_total``,
  ``unhealthy_replacements_total``). Before, the counters stayed for the operator's life, one set per
  fleet ever scaled or repaired, and a fleet created again under the name went on with the old counts;
* another fleet's series stay;
* a fleet whose autoscaling is switched off keeps its counts of past scalings (it is still there).

In-process: the reconcile's threaded part stood in (it would find the fleet gone), no API server.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import kopf
import pytest

from prefixfleet.operator import handlers
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    autoscale_forget,
)
from prefixfleet.operator.handlers import OperatorContext, ReconcileOutcome, reconcile
from tests.test_autoscale_leftover_warming import fleet_body, operator_memo

LOG = logging.getLogger("test.operator.deleted_fleet_series")
GONE, KEPT = "chat", "code"


@pytest.fixture
async def memo() -> AsyncIterator[kopf.Memo]:
    async with operator_memo(OperatorContext(kube=None)) as memo:  # type: ignore[arg-type]  # stand-in
        yield memo


def record_activity(auto: AutoscaleContext, fleet: str) -> None:
    """Every series a fleet gets from autoscaler rounds and reconciles that replaced a replica, with
    the autoscaler's memory of it (the rounds keep one)."""
    auto.fleets[f"default/{fleet}"] = FleetAutoscale()
    metrics = auto.metrics
    for action in ("scale_up", "scale_down", "prewarm", "drain"):
        metrics.scale_events.labels("default", fleet, action).inc()
    for reason in ("unready", "never_ready"):
        metrics.unhealthy_replacements.labels("default", fleet, reason).inc()
    metrics.unavailable_replicas.labels("default", fleet).set(1)
    metrics.replicas.labels("default", fleet).set(2)
    metrics.max_replicas.labels("default", fleet).set(4)
    metrics.target_ttft.labels("default", fleet).set(1)
    metrics.engine_source("default", fleet, "scrape")


def series_of(metrics: OperatorMetrics, fleet: str) -> set[str]:
    return {
        f"{s.name}{sorted(s.labels.items())}"
        for family in metrics.registry.collect()
        for s in family.samples
        if s.labels.get("fleet") == fleet and not s.name.endswith("_created")
    }


def gone(*_: object) -> ReconcileOutcome | None:
    return None  # what reconcile_in_cluster returns for a fleet that is gone or going


async def test_a_deleted_fleet_leaves_no_series(memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics: OperatorMetrics = memo.autoscale.metrics
    for fleet in (GONE, KEPT):
        record_activity(memo.autoscale, fleet)
    kept = series_of(metrics, KEPT)
    assert len(kept) == 14 and len(series_of(metrics, GONE)) == 14
    monkeypatch.setattr(handlers, "reconcile_in_cluster", gone)
    await reconcile(memo.ctx, "default", GONE, LOG)
    await autoscale_forget(body=fleet_body(True, name=GONE), memo=memo, type="DELETED")
    assert series_of(metrics, GONE) == set()
    assert series_of(metrics, KEPT) == kept


async def test_a_fleet_no_longer_autoscaled_keeps_its_counts(memo: kopf.Memo) -> None:
    metrics: OperatorMetrics = memo.autoscale.metrics
    record_activity(memo.autoscale, KEPT)
    memo.ctx = None  # no pods to list: only the autoscaler's memory and series are at stake
    await autoscale_forget(body=fleet_body(False, name=KEPT), memo=memo, type="MODIFIED")
    assert {s.split("[")[0] for s in series_of(metrics, KEPT)} == {
        "prefixfleet_operator_scale_events_total",
        "prefixfleet_operator_unhealthy_replacements_total",
        "prefixfleet_operator_unavailable_replicas",
    }
