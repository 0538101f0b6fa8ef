"""The operator's per-fleet bookkeeping of reconciles (operator/handlers.py: ``OperatorContext.locks``,
``rechecks``) holds only what is in use. Specification:
* the reconciles of one fleet still run one at a time (a second one waits for the first);
* once none holds or waits for a fleet's lock, the lock is gone: a fleet deleted (or only named by a
  pod event after it went) leaves none behind, where before every fleet name ever reconciled kept
  one for the operator's life;
* a recheck that has run its reconcile leaves no entry (before, the done task stayed until the fleet
  was deleted, and for ever when the recheck was planned by a reconcile racing the deletion).

The reconcile's threaded part is replaced by a stand-in: no API server is called.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from fleet_fixtures import eventually

from prefixfleet.operator import handlers
from prefixfleet.operator.handlers import OperatorContext, ReconcileOutcome, reconcile, schedule_recheck

LOG = logging.getLogger("test.operator.fleet_locks")
KEY = "default/chat"


def context() -> OperatorContext:
    return OperatorContext(kube=None)  # type: ignore[arg-type]  # the stand-in reconciles


async def test_reconciles_run_one_at_a_time_and_leave_no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context()
    inside, release = threading.Event(), threading.Event()
    running: list[str] = []
    overlapped: list[bool] = []

    def stand_in(_: OperatorContext, namespace: str, name: str) -> ReconcileOutcome | None:
        overlapped.append(bool(running))
        running.append(name)
        inside.set()
        assert release.wait(10)
        running.remove(name)
        return None  # the fleet is gone

    monkeypatch.setattr(handlers, "reconcile_in_cluster", stand_in)
    first = asyncio.create_task(reconcile(ctx, "default", "chat", LOG))
    assert await asyncio.to_thread(inside.wait, 10)
    second = asyncio.create_task(reconcile(ctx, "default", "chat", LOG))  # waits for the first
    await eventually(lambda: KEY in ctx.queued, 10, "the second reconcile to wait for the lock")
    release.set()
    await asyncio.gather(first, second)
    assert overlapped == [False, False]  # both ran, one after the other
    assert ctx.locks == {} and ctx.queued == set()


async def test_a_recheck_that_ran_leaves_no_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context()
    reconciled = threading.Event()

    def stand_in(_: OperatorContext, namespace: str, name: str) -> ReconcileOutcome | None:
        reconciled.set()
        return None

    monkeypatch.setattr(handlers, "reconcile_in_cluster", stand_in)
    schedule_recheck(ctx, "default", "chat", LOG, 0)
    _, task = ctx.rechecks[KEY]
    await asyncio.wait_for(task, 30)
    assert reconciled.is_set()
    assert ctx.rechecks == {} and ctx.locks == {}


async def test_a_reconcile_cancelled_while_waiting_leaves_the_fleet_reconcilable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reconcile waiting for the lock is cancelled (fleet_deleted and schedule_recheck cancel a
    pending recheck, which may be past its sleep): its place in ``queued`` goes with it. Kept, every
    later reconcile of the fleet (its timer's, its events') returned as if one were still waiting."""
    ctx = context()
    inside, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def stand_in(_: OperatorContext, namespace: str, name: str) -> ReconcileOutcome | None:
        runs.append(name)
        inside.set()
        assert release.wait(10)
        return None

    monkeypatch.setattr(handlers, "reconcile_in_cluster", stand_in)
    first = asyncio.create_task(reconcile(ctx, "default", "chat", LOG))
    assert await asyncio.to_thread(inside.wait, 10)
    waiting = asyncio.create_task(reconcile(ctx, "default", "chat", LOG))
    await eventually(lambda: KEY in ctx.queued, 10, "the second reconcile to wait for the lock")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await first
    assert KEY not in ctx.queued
    await asyncio.wait_for(reconcile(ctx, "default", "chat", LOG), 30)
    assert runs == ["chat", "chat"]  # the later reconcile ran
    assert ctx.locks == {} and ctx.queued == set()
