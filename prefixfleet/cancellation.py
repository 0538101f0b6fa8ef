"""Stopping tasks: background loops for good, and a command's main task on SIGTERM.

A loop cancelled once can keep running on Python 3.11: ``asyncio.wait_for`` (which redis-py wraps
around every command) swallows a cancel that arrives just as the wrapped call completes, so the
loop goes on to its next round and a shutdown that awaits it hangs. ``cancel_and_wait`` cancels
again every ``retry_s`` until each task has ended, and gives up after ``limit_s`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
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


@contextlib.contextmanager
def sigterm_cancels(on_sigterm: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGTERM calls ``on_sigterm`` (typically: cancel the command's main task, so
    its teardown stops the processes it started, as Ctrl-C does). Installed only where the running
    loop can take a signal handler (the main thread, a Unix loop); elsewhere SIGTERM keeps its
    default action."""
    loop = asyncio.get_running_loop()
    installed = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        installed = True
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)
