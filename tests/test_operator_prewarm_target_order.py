"""Which new pod a scale-up's ``new-<i>`` pre-warm target names (``_target_pod``).

A scale-up by two plans ``new-0`` and ``new-1``; the reconcile then creates ``fleet-replica-9`` and
``fleet-replica-10`` one after the other, usually within the same second (``creationTimestamp`` has
one-second resolution). Each target's task polls the pods until its one has appeared. Before, ties
were broken by the pod's name as text, where ``fleet-replica-10`` sorts before ``fleet-replica-9``:
``new-0``, resolved while only replica-9 existed, took it, and ``new-1`` then took index 1 of
``[replica-10, replica-9]``, replica-9 again. Replica-10 was never marked ``warming`` nor warmed (it
took traffic cold) and replica-9's second warm-up was dropped as "already warming". Ties are now
broken by the replica index, the order the reconcile creates pods in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from prefixfleet.operator import autoscale_handlers
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.planner import FleetRef, ObservedPod, replica_name

REF = FleetRef(name="fleet", namespace="default", uid="u")
SAME_SECOND = "2026-12-02T10:00:00Z"
KNOWN = {replica_name(REF, k) for k in range(9)}


def pod(index: int, created: str = SAME_SECOND) -> ObservedPod:
    return ObservedPod(name=replica_name(REF, index), phase="Running", created=created)


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ObservedPod]]:
    """The replica pods the API server lists (the known ones and the new ones), set by the test."""
    pods = [pod(k, "2026-12-02T09:00:00Z") for k in range(9)]

    async def list_pods(_ctx: OperatorContext, _ref: FleetRef) -> list[ObservedPod]:
        return list(pods)

    monkeypatch.setattr(autoscale_handlers, "_list_pods", list_pods)
    yield pods


async def target(name: str) -> str | None:
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]  # _list_pods is replaced
    return await autoscale_handlers._target_pod(ctx, REF, name, KNOWN, time.monotonic() + 5.0)


async def test_the_second_new_pod_is_the_tenth_replica_when_the_ninth_was_taken_first(
    listed: list[ObservedPod],
) -> None:
    listed.append(pod(9))
    assert await target("new-0") == replica_name(REF, 9)
    listed.append(pod(10))  # created in the same second
    assert await target("new-1") == replica_name(REF, 10)


async def test_two_new_pods_of_one_second_are_taken_in_index_order(listed: list[ObservedPod]) -> None:
    listed += [pod(10), pod(9), pod(11)]
    got = [await target(f"new-{i}") for i in range(3)]
    assert got == [replica_name(REF, 9), replica_name(REF, 10), replica_name(REF, 11)]


async def test_an_earlier_creation_time_still_comes_first(listed: list[ObservedPod]) -> None:
    listed += [pod(9, "2026-12-02T10:00:01Z"), pod(12, "2026-12-02T10:00:00Z")]
    assert await target("new-0") == replica_name(REF, 12)
    assert await target("new-1") == replica_name(REF, 9)
