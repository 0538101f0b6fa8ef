"""The reconcile planned for when an unready replica's allowance runs out (operator/handlers.py,
``schedule_recheck``). Specification:
* one pending per fleet; a later due time keeps the pending one, an earlier one replaces it and the
  replaced task is cancelled (it would only reconcile once more for nothing, and nothing would
  cancel it at shutdown);
* a recheck that is itself running the reconcile is not pending any more: the reconcile it runs
  plans the next one (another unready replica's allowance), instead of it being dropped.

The delays are long and every task is cancelled before it would reconcile: the API server is
never called.
"""

from __future__ import annotations

import asyncio
import logging

from prefixfleet.operator.handlers import OperatorContext, schedule_recheck

LOG = logging.getLogger("test.operator.recheck")
KEY = "default/chat"


def context() -> OperatorContext:
    return OperatorContext(kube=None)  # type: ignore[arg-type]  # nothing here reaches the API server


async def test_one_recheck_per_fleet_moved_earlier_when_needed() -> None:
    ctx = context()
    schedule_recheck(ctx, "default", "chat", LOG, 600)
    first = ctx.rechecks[KEY][1]
    schedule_recheck(ctx, "default", "chat", LOG, 900)  # later: the pending one stays
    assert ctx.rechecks[KEY][1] is first
    schedule_recheck(ctx, "default", "chat", LOG, 300)  # earlier: it replaces the pending one
    second = ctx.rechecks[KEY][1]
    assert second is not first
    await asyncio.sleep(0)
    assert first.cancelled() and not second.done()
    second.cancel()


async def test_a_running_recheck_lets_its_reconcile_plan_the_next_one() -> None:
    ctx = context()

    async def recheck_running_its_reconcile() -> None:
        # as reconcile_later does once its delay passed: the reconcile ends by planning the next
        ctx.rechecks[KEY] = (0.0, asyncio.current_task())  # type: ignore[assignment]
        schedule_recheck(ctx, "default", "chat", LOG, 600)

    await asyncio.create_task(recheck_running_its_reconcile())
    due, task = ctx.rechecks[KEY]
    assert not task.done() and due > 0.0  # the next recheck is pending
    task.cancel()
