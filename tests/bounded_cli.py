"""The real `prefixfleet` CLI in a subprocess, bounded in time and memory.

For tests of input that once hung building gigabytes: should the check under test regress, the
child fails with TimeoutExpired or a MemoryError instead of stalling the suite or taking a shared
machine's memory.
"""

from __future__ import annotations

import resource
import subprocess
import sys

# Generous for a loaded 2-core machine: a refusal takes well under a second after the imports.
TIMEOUT_S = 120
CHILD_MEMORY = 4 << 30  # address space: the CLI's imports need a fraction of it


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def run_cli(argv: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefixfleet.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=_limit_memory,
    )
