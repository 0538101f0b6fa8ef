"""cancel_and_wait: a shutdown ends loops that swallow a cancel, and never hangs."""

from __future__ import annotations

import asyncio

from prefixfleet.cancellation import cancel_and_wait


async def _swallows_first_cancel(rounds: list[int]) -> None:
    """A loop whose first cancel is lost, as asyncio.wait_for can lose it on Python 3.11."""
    swallowed = False
    while True:
        rounds.append(1)
        try:
            await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True


async def test_a_loop_that_swallows_one_cancel_is_cancelled_again() -> None:
    rounds: list[int] = []
    task = asyncio.create_task(_swallows_first_cancel(rounds))
    await asyncio.sleep(0.02)
    # one cancel and a wait is what shutdown used to do: the loop runs on
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.1)
    assert not done and len(rounds) > 1
    assert await cancel_and_wait([task], retry_s=0.05) == []
    assert task.cancelled()


async def test_a_task_that_never_stops_is_returned_after_the_limit() -> None:
    stubborn = True

    async def ignores_cancels() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if not stubborn:
                    raise

    task = asyncio.create_task(ignores_cancels())
    await asyncio.sleep(0)
    assert await cancel_and_wait([task], retry_s=0.02, limit_s=0.1) == [task]
    stubborn = False  # let the test's loop close
    assert await cancel_and_wait([task]) == [] and task.cancelled()


async def test_finished_and_failed_tasks_are_consumed_without_raising() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def returns() -> int:
        return 1

    failed, ok = asyncio.create_task(fails()), asyncio.create_task(returns())
    await asyncio.sleep(0)
    assert await cancel_and_wait([failed, ok]) == []
    assert failed.done() and ok.result() == 1
