"""The local autoscaler forgets the creation time of a replica that has left the fleet.

``LocalAutoscaler.created`` got an entry for every replica the autoscaler started and lost none:
a long ``prefixfleet up --autoscale`` run (names keep growing: a new replica takes the index above
every one still there) kept them all. A round now keeps only the replicas in its view of the fleet,
taken at one moment (tests/test_local_autoscaler_round_snapshot.py): one that joins during the
round's awaits keeps its creation time (pruned against a list read after the awaits, it would not).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fleet_fixtures import RedisServer
from test_local_autoscaler_round_snapshot import fake_fleet, replica
from test_local_autoscaler_round_snapshot import one_round as snapshot_round

from prefixfleet.fleet.autoscale import LocalAutoscaler, present_only
from prefixfleet.operator.autoscale import ScalePolicy


def scaler_of(*replicas: SimpleNamespace) -> LocalAutoscaler:
    fleet = fake_fleet(*replicas)
    # no plan to carry out: the fleet is within 1..8 and nothing is loaded
    return LocalAutoscaler(fleet, ScalePolicy(min_replicas=1, max_replicas=8), interval_s=0.5)


async def one_round(scaler: LocalAutoscaler, *args: Any) -> None:
    """One round (the snapshot tests' helper: on a real Valkey, with a change during its Redis
    read) that has nothing to carry out."""
    plan = await snapshot_round(scaler, *args)
    assert plan.add == 0 and plan.drain == (), plan


def test_present_only_keeps_the_named_replicas() -> None:
    created = {"replica-0": 1.0, "replica-3": 2.0, "replica-7": 3.0}
    assert present_only(created, ["replica-3", "replica-9"]) == {"replica-3": 2.0}
    assert present_only(created, []) == {}
    assert created == {"replica-0": 1.0, "replica-3": 2.0, "replica-7": 3.0}  # a new dict


@pytest.mark.timeout(60)
async def test_a_round_forgets_replicas_that_left_the_fleet(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    scaler = scaler_of(replica(4), replica(5))
    # replicas 0-3 were started by earlier rounds and have since been drained or reaped
    scaler.created.update({f"replica-{i}": 1000.0 + i for i in range(6)})
    await one_round(scaler, redis_server, monkeypatch)
    assert scaler.created == {"replica-4": 1004.0, "replica-5": 1005.0}
    # and one drained or reaped later is forgotten by the next round
    scaler.fleet.replicas.pop(0)
    await one_round(scaler, redis_server, monkeypatch)
    assert scaler.created == {"replica-5": 1005.0}


@pytest.mark.timeout(60)
async def test_a_replica_joining_during_the_round_keeps_its_creation_time(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    scaler = scaler_of(replica(0))
    scaler.created["replica-0"] = 1000.0

    def replica_1_joins() -> None:
        # what _add_replica does as its start completes, with no await in between
        scaler.created["replica-1"] = 2000.0
        scaler.fleet.replicas.append(replica(1))

    await one_round(scaler, redis_server, monkeypatch, replica_1_joins)
    assert scaler.created == {"replica-0": 1000.0, "replica-1": 2000.0}
    # the next round observes it with that time
    await one_round(scaler, redis_server, monkeypatch)
    assert scaler.observed is not None
    created = {r.replica_id: r.created_s for r in scaler.observed.replicas}
    assert created == {"replica-0": 1000.0, "replica-1": 2000.0}, created
