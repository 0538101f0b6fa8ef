"""pytest setup shared by every test module: makes ``fleet_fixtures`` and ``chart_fixtures`` importable,
registers their fixtures, and sets the hypothesis profile."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest
from chart_fixtures import chart
from fleet_fixtures import redis_server, spawn
from hypothesis import settings

# Property tests check behaviour, not speed: hypothesis's per-example deadline (200 ms) is a timing
# assertion that a busy 2-core CI machine fails at random.
settings.register_profile("prefixfleet", deadline=None)
settings.load_profile("prefixfleet")

__all__ = ["chart", "redis_server", "spawn"]


def slow_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items of every module holding a ``slow`` test, then the rest, each in collection order.

    `make test` hands whole files to pytest-xdist workers in this order (``--no-loadscope-reorder``):
    the long end-to-end files start at once instead of last, where one of them alone would hold the
    whole run for its minute or two while the other workers sit idle."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    return [i for i in items if i.path in slow] + [i for i in items if i.path not in slow]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = slow_modules_first(items)
