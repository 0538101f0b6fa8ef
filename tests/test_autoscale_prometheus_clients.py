"""The autoscaler's Prometheus clients (operator/autoscale_handlers.py, ``AutoscaleContext.prometheus``:
one per URL, shared by the fleets that read it). Specification:
* a client is closed and dropped once no autoscaled fleet's last round read its URL: the fleet was
  deleted, its autoscaling switched off, or its ``spec.prometheus.url`` pointed elsewhere. Before,
  each URL ever read kept its client (and its connections) for the operator's life;
* a client another fleet still reads stays.

In-process, plain data; the one round runs ``_read_engines`` against a Prometheus that refuses
connections (a free port nothing listens on): it falls back to the scrape of no replicas.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import kopf
import pytest
from fleet_fixtures import free_port

from prefixfleet.operator import prometheus_source
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    _read_engines,
    autoscale_forget,
)
from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import FleetRef
from tests.test_autoscale_leftover_warming import fleet_body, operator_memo

LOG = logging.getLogger("test.autoscale.prometheus_clients")
A, B = "http://prometheus-a.monitoring:9090", "http://prometheus-b.monitoring:9090"


@pytest.fixture
async def memo(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[kopf.Memo]:
    closed: list[str] = []
    monkeypatch.setattr(prometheus_source.PrometheusSource, "close", lambda self: closed.append(self.url))
    async with operator_memo(None) as memo:  # no pods to list: only the autoscaler is at stake
        memo.closed = closed
        yield memo


def reading(auto: AutoscaleContext, fleet: str, url: str) -> None:
    """What a round of ``fleet`` reading ``url`` leaves behind."""
    auto.fleets[f"default/{fleet}"] = FleetAutoscale(prometheus_url=url)
    auto.prometheus_source(url)


@pytest.mark.parametrize(("event", "autoscaled"), [("DELETED", True), ("MODIFIED", False)])
async def test_a_fleet_gone_or_no_longer_autoscaled_closes_the_client_only_it_read(
    memo: kopf.Memo, event: str, autoscaled: bool
) -> None:
    auto: AutoscaleContext = memo.autoscale
    reading(auto, "chat", A)
    reading(auto, "code", B)
    reading(auto, "docs", B)
    await autoscale_forget(body=fleet_body(autoscaled, name="chat"), memo=memo, type=event)
    assert memo.closed == [A] and list(auto.prometheus) == [B]
    await autoscale_forget(body=fleet_body(autoscaled, name="code"), memo=memo, type=event)
    assert memo.closed == [A] and list(auto.prometheus) == [B]  # docs still reads it


async def test_a_fleet_pointed_elsewhere_closes_the_client_it_read(memo: kopf.Memo) -> None:
    auto: AutoscaleContext = memo.autoscale
    elsewhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: the round falls back to scraping
    reading(auto, "chat", A)
    state = auto.fleets["default/chat"]
    fleet = {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 1}
    spec = validate_spec({**fleet, "prometheus": {"url": elsewhere}})
    await _read_engines(auto, state, spec, FleetRef(name="chat", namespace="default"), {}, LOG)
    assert memo.closed == [A] and list(auto.prometheus) == [elsewhere]
    assert state.prometheus_url == elsewhere
