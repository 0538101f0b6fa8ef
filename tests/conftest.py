"""pytest setup shared by every test module: makes ``fleet_fixtures`` importable, registers its fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_fixtures import redis_server, spawn

__all__ = ["redis_server", "spawn"]
