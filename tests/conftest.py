"""pytest setup shared by every test module: makes ``fleet_fixtures`` importable, registers its fixtures,
and sets the hypothesis profile."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_fixtures import redis_server, spawn
from hypothesis import settings

# Property tests check behaviour, not speed: hypothesis's per-example deadline (200 ms) is a timing
# assertion that a busy 2-core CI machine fails at random.
settings.register_profile("prefixfleet", deadline=None)
settings.load_profile("prefixfleet")

__all__ = ["redis_server", "spawn"]
