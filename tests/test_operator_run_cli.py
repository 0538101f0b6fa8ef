"""`prefixfleet operator run` refuses bad options with one line, before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PREFIXFLEET = str(Path(sys.executable).parent / "prefixfleet")


def test_bad_liveness_and_redis_urls_are_refused() -> None:
    for args, word in ((["--liveness", "nonsense"], "--liveness"), (["--redis", "http://x"], "--redis")):
        result = subprocess.run(
            [PREFIXFLEET, "operator", "run", *args], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 2
        assert word in result.stderr and "Traceback" not in result.stderr
