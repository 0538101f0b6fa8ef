"""`prefixfleet operator run` refuses bad options with one line, before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PREFIXFLEET = str(Path(sys.executable).parent / "prefixfleet")


def test_bad_liveness_and_redis_urls_are_refused() -> None:
    cases = (
        (["--liveness", "nonsense"], "--liveness"),
        (["--redis", "http://x"], "--redis"),
        # a final newline (a value pasted from a file): Python's '$' would match before it
        (["--liveness", "http://0.0.0.0:8080/healthz\n"], "--liveness"),
        (["--prometheus", "http://prometheus:9090\n"], "--prometheus"),
    )
    for args, word in cases:
        result = subprocess.run(
            [PREFIXFLEET, "operator", "run", *args], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 2
        assert word in result.stderr and "Traceback" not in result.stderr
