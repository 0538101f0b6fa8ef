"""The simulator's emulator model can give gateways the sidecars' reported rates (report_rates).

Live, each sidecar publishes its worker's decayed arrival and cache-write rates in its load records,
and queue_aware reads a replica's rate as the reported one plus its own sends since (3eb11bf). The
simulator's model of several gateways had no such field, so each simulated gateway counted only its
own sends: with two gateways, half of every replica's traffic, whatever the live code does. With
``ServiceConfig(report_rates=True)`` (emulator only) each simulated sidecar counts what it forwards
and puts both rates in the load records it pushes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from prefixfleet.router.policies import Decision, QueueAware, ReplicaState, RouteRequest
from prefixfleet.router.policies.base import RATE_WINDOW_S, DecayedRate
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.engine import ServiceConfig
from prefixfleet.sim.simulator import FleetConfig, simulate
from prefixfleet.sim.workloads import WorkloadRequest
from tests.test_sim_emulated import EMULATED  # the local fleet's engines at prefixroute's settings

PREFIX = as_token_bytes(range(600))


class Recording(QueueAware):
    """queue_aware that keeps, per decision, the views and the arrival rate it charged replica 0."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[RouteRequest, list[ReplicaState], float]] = []

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        lam = self.replica_arrival_rate(replicas[0], request.now)
        self.seen.append((request, list(replicas), lam))
        return super().choose(request, replicas)


def _requests(n: int, gap_s: float) -> list[WorkloadRequest]:
    """One tenant's turns: a shared 600-token prefix and a new 50-token suffix each."""
    return [
        WorkloadRequest(i * gap_s, PREFIX + as_token_bytes(range(10_000 + 50 * i, 10_050 + 50 * i)), 4, "t")
        for i in range(n)
    ]


def _run(service: ServiceConfig, gateways: int = 2) -> tuple[list[Recording], DecayedRate]:
    reqs = _requests(60, 0.05)  # 20 requests a second for 3 s, alternating between the gateways
    routers = [Recording() for _ in range(gateways)]
    simulate(reqs, routers, FleetConfig(1, 8000, service))
    truth = DecayedRate()  # every request the one replica got, counted when routed (no delays here)
    for r in reqs[:-1]:
        truth.add(1.0, r.arrival_s, RATE_WINDOW_S)
    return routers, truth


def test_with_reported_rates_each_gateway_charges_the_replicas_whole_arrival_rate() -> None:
    routers, truth = _run(replace(EMULATED, report_rates=True))
    last = routers[1]
    request, views, lam = last.seen[-1]  # request #59, through gateway 1: 59 earlier, 30 of them gateway 0's
    assert views[0].reported_arrivals_per_s is not None
    assert lam == pytest.approx(truth.rate(request.now, RATE_WINDOW_S))
    # the write rate counts every prompt's part past the sidecar's mirror: the first whole, then suffixes
    assert last.write_rate(views[0], request.now) > 0


def test_without_them_each_of_two_gateways_sees_half_of_the_traffic_as_before() -> None:
    routers, truth = _run(EMULATED)
    last = routers[1]
    request, views, own = last.seen[-1]
    assert views[0].reported_arrivals_per_s is None
    assert own == pytest.approx(truth.rate(request.now, RATE_WINDOW_S) / 2, rel=0.05)


def test_one_gateway_with_reports_charges_what_it_charged_from_its_own_sends() -> None:
    (with_reports,), _ = _run(replace(EMULATED, report_rates=True), gateways=1)
    (own_only,), _ = _run(EMULATED, gateways=1)
    assert [lam for *_, lam in with_reports.seen] == pytest.approx([lam for *_, lam in own_only.seen])
    assert with_reports.seen[-1][1][0].reported_arrivals_per_s


def test_report_rates_is_refused_outside_the_emulator_model() -> None:
    for service in ("fifo", "batched"):
        with pytest.raises(ValueError, match="report_rates applies to the emulator service model only"):
            ServiceConfig(service, report_rates=True)


def test_the_up_sim_check_models_the_rates_live_sidecars_report() -> None:
    from prefixfleet.fleet.local import LIVE_VIEW_TIMING

    assert LIVE_VIEW_TIMING["report_rates"] is True
    ServiceConfig("emulator", prefill_s_per_token=1e-4, **LIVE_VIEW_TIMING)  # a valid emulator config
