"""A deleted fleet's finalizer goes soon after its timers finish, not kopf's minute later.

kopf removes a deleted object's finalizer only once the object's timers have exited. A timer that
is mid-run when the deletion is processed (fleet_timer's reconcile, autoscale_timer's round) is
not cancelled: kopf checks it again every ``settings.background.cancellation_polling`` seconds
(60 by default) and nothing else wakes that check, so such a fleet stayed for a minute after its
cleanup had succeeded ("Deletion is processed: 1 succeeded", then nothing).
tests/test_operator_rbac_calls.py's 60 s wait for the finalizer timed out on exactly that under
load. Here kopf's own ``stop_daemons`` (what its deletion cycle calls) judges the operator's real
timers with the settings ``configure`` gives it.
"""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest
from kopf._core.engines import daemons
from kopf._core.intents import stoppers
from kopf._core.intents.handlers import TimerHandler

from prefixfleet.operator import autoscale_handlers, handlers
from prefixfleet.operator.models import PLURAL

# kopf's default: a fleet whose timer was mid-run at deletion kept its finalizer this long.
KOPF_DEFAULT_POLLING_S = 60.0


def fleet_timers() -> list[TimerHandler]:
    """The timers the operator registers on PrefixCacheFleets (its modules are imported above)."""
    assert autoscale_handlers.autoscale_timer is not None  # registers autoscale_timer
    registry = kopf.get_default_registry()
    found = [
        h
        for h in registry._spawning.get_all_handlers()
        if isinstance(h, TimerHandler) and h.selector is not None and h.selector.plural == PLURAL
    ]
    return sorted(found, key=lambda h: h.id)


async def configured_settings(monkeypatch: pytest.MonkeyPatch) -> kopf.OperatorSettings:
    """The settings after the operator's start-up handler (its API client stubbed: no cluster)."""
    monkeypatch.setattr(handlers, "load_api_client", lambda: None)
    settings = kopf.OperatorSettings()
    await handlers.configure(settings=settings, memo=kopf.Memo(), logger=logging.getLogger(__name__))
    return settings


def test_the_operator_registers_the_fleet_timers_this_test_stops() -> None:
    assert [h.id for h in fleet_timers()] == ["autoscale_timer", "fleet_timer"]


async def test_a_timer_mid_run_at_deletion_is_checked_again_within_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = await configured_settings(monkeypatch)
    finish = asyncio.Event()
    running = {
        h.id: daemons.Daemon(
            task=asyncio.create_task(finish.wait()),  # a reconcile/round still in progress
            logger=logging.getLogger(__name__),
            handler=h,
            stopper=stoppers.DaemonStopper(),
        )
        for h in fleet_timers()
    }
    try:
        delays = await daemons.stop_daemons(settings=settings, daemons=running)
        # each timer still runs: the finalizer stays, and kopf looks again after this long
        assert len(delays) == len(running)
        assert max(delays) <= handlers.TIMER_EXIT_POLL_S < KOPF_DEFAULT_POLLING_S
        assert all(d.stopper.is_set() for d in running.values()), "the timers were told to stop"
    finally:
        finish.set()
        await asyncio.gather(*(d.task for d in running.values()))
    # the rounds ended: the next check finds nothing left to wait for, so the finalizer goes
    assert await daemons.stop_daemons(settings=settings, daemons=running) == []
