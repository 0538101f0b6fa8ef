"""Stopping background tasks for good.

A loop cancelled once can keep running on Python 3.11: ``asyncio.wait_for`` (which redis-py wraps
around every command) swallows a cancel that arrives just as the wrapped call completes, so the
loop goes on to its next round and a shutdown that awaits it hangs. ``cancel_and_wait`` cancels
again every ``retry_s`` until each task has ended, and gives up after ``limit_s`` instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], *, retry_s: float = 0.5, limit_s: float = 10.0
) -> list[asyncio.Task[Any]]:
    """Cancel ``tasks`` until they end; return those still running after ``limit_s``.

    Their results and exceptions are consumed: the caller is shutting down and has already
    logged what a loop raised while it ran.
    """
    tasks = list(tasks)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(retry_s, left))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit
    return [t for t in tasks if not t.done()]
