"""`prefixfleet chaos redis-outage`: the outage must end while traffic still runs.

Redis stops a fifth into the run; an `--outage` reaching past `--duration` restarted Redis after the
last request (or never, once the fault outlived the 120 s it is given after the traffic), so the
report's `after_restart` phase and recovery times measured nothing, after minutes of fleet time.
It is refused before any process starts, as every other bad flag is.
"""

from __future__ import annotations

import argparse

import pytest

from prefixfleet.chaos.cli import _plan
from prefixfleet.chaos.scenarios import redis_stop_at
from prefixfleet.cli import UsageError, build_parser


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["chaos", "redis-outage", *flags])


@pytest.mark.parametrize(
    "flags", [("--outage", "100", "--duration", "10"), ("--outage", "8", "--duration", "10")]
)
def test_an_outage_that_does_not_end_before_the_traffic_is_refused(flags: tuple[str, ...]) -> None:
    with pytest.raises(UsageError, match=r"--outage must end before the traffic does: Redis stops at 2 s"):
        _plan(_args(*flags))


@pytest.mark.parametrize("flags", [(), ("--outage", "7.5", "--duration", "10")])
def test_an_outage_within_the_traffic_is_planned(flags: tuple[str, ...]) -> None:
    plan = _plan(_args(*flags))
    args = _args(*flags)
    assert redis_stop_at(plan.duration_s) + args.outage < plan.duration_s
