"""A pod left marked ``warming`` by an operator that died mid warm-up, on a fleet that is no longer
autoscaled by the time an operator runs again (in-process: the autoscaler's fleet event handler
against the emulated API server).

Specification: only the autoscaler's warm-up task marks a pod ``warming`` and only it (or the next
round of an autoscaled fleet) removes the mark. A fleet whose autoscaling was switched off has no
rounds, so nothing removed a leftover mark: the pod was published as ``warming`` to the gateways
for ever and served nothing. Now the first event of a fleet that is not autoscaled clears the
leftover marks of its pods (and only ``warming`` marks: a draining pod stays draining), once per
process and fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest

from prefixfleet.operator.autoscale_handlers import autoscale_forget, start_autoscaler, stop_autoscaler
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import ANNOTATION_STATE
from tests.test_autoscale_e2e import FLEET, replica_pod
from tests.test_autoscale_round_races import kube

__all__ = ["kube"]  # the fixture: the emulated API server with the CRD

WARMING, DRAINING, PLAIN = (f"{FLEET}-replica-{i}" for i in range(3))


def fleet_body(autoscaled: bool, uid: str = "fleet-uid", name: str = FLEET) -> kopf.Body:
    """A fleet as the autoscaler's event handler gets it (the other handler tests import it)."""
    return kopf.Body({
        "apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"replicas": 3, "autoscaling": {"enabled": autoscaled}},
    })  # fmt: skip


@contextlib.asynccontextmanager
async def operator_memo(ctx: OperatorContext | None) -> AsyncIterator[kopf.Memo]:
    """kopf's memo as the operator's startup handlers leave it (``ctx``, and the autoscaler's context
    with its metrics wired into ``ctx``; not served), cleaned up as at shutdown (the other handler
    tests use it)."""
    memo = kopf.Memo()
    memo.ctx = ctx
    memo.metrics_port = 0
    await start_autoscaler(memo=memo, logger=logging.getLogger("test.autoscale.handlers"))
    try:
        yield memo
    finally:
        await stop_autoscaler(memo=memo)
        await asyncio.sleep(0)


def state_of(kube: Kube, name: str) -> str | None:
    pod: dict[str, Any] = kube.get("Pod", "default", name) or {}
    return (pod.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_STATE)


@pytest.fixture
async def memo(kube: Kube) -> AsyncIterator[kopf.Memo]:
    async with operator_memo(OperatorContext(kube=kube)) as memo:
        yield memo


async def test_a_warming_mark_left_on_a_fleet_no_longer_autoscaled_is_cleared(
    kube: Kube, memo: kopf.Memo
) -> None:
    for i, (name, mark) in enumerate(((WARMING, "warming"), (DRAINING, "draining"), (PLAIN, None))):
        kube.create(replica_pod(name, f"http://127.0.0.1:{41000 + i}"))
        if mark:
            kube.annotate("Pod", "default", name, {ANNOTATION_STATE: mark})
    # an autoscaled fleet's marks are its rounds' business (a warm-up may be under way)
    await autoscale_forget(body=fleet_body(True), memo=memo, type=None)
    assert state_of(kube, WARMING) == "warming"
    # the fleet as the restarted operator first sees it: autoscaling off
    await autoscale_forget(body=fleet_body(False), memo=memo, type=None)
    assert state_of(kube, WARMING) is None  # published as ready again: it serves
    assert state_of(kube, DRAINING) == "draining" and state_of(kube, PLAIN) is None
    # once per fleet: later events of the same fleet list no pods
    kube.annotate("Pod", "default", PLAIN, {ANNOTATION_STATE: "warming"})
    await autoscale_forget(body=fleet_body(False), memo=memo, type=None)
    assert state_of(kube, PLAIN) == "warming"


async def test_a_deleted_fleet_not_autoscaled_is_forgotten(kube: Kube, memo: kopf.Memo) -> None:
    """Its "marks cleared" note goes with it: the operator's memory does not grow with every fleet
    created and deleted over its life (before, a fleet deleted while not autoscaled stayed)."""
    await autoscale_forget(body=fleet_body(False), memo=memo, type=None)
    assert memo.autoscale.unmarked  # checked once: noted
    await autoscale_forget(body=fleet_body(False), memo=memo, type="DELETED")
    assert not memo.autoscale.unmarked
    # so is an autoscaled one switched off, then deleted while autoscaled again or not
    await autoscale_forget(body=fleet_body(False), memo=memo, type=None)
    await autoscale_forget(body=fleet_body(True), memo=memo, type="DELETED")
    assert not memo.autoscale.unmarked


async def test_a_fleet_created_again_under_its_name_is_checked_again(kube: Kube, memo: kopf.Memo) -> None:
    """A new fleet of a deleted one's name is another fleet: its leftover warming marks are cleared
    at its first event, whether or not the old one's deletion was seen (a watch restarted across it
    does not deliver a DELETED event). Before, the new fleet inherited "already checked"."""
    kube.create(replica_pod(WARMING, "http://127.0.0.1:41000"))
    await autoscale_forget(body=fleet_body(False, uid="old"), memo=memo, type=None)
    for uid, deleted_seen in (("new", False), ("newer", True)):
        if deleted_seen:
            await autoscale_forget(body=fleet_body(False, uid="new"), memo=memo, type="DELETED")
        kube.annotate("Pod", "default", WARMING, {ANNOTATION_STATE: "warming"})  # left by another operator
        await autoscale_forget(body=fleet_body(False, uid=uid), memo=memo, type=None)
        assert state_of(kube, WARMING) is None, uid
