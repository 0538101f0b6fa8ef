"""Resident memory of a process (Linux /proc), for memory-bound checks and soak figures."""

from __future__ import annotations

from pathlib import Path


def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid`` in bytes, or None when the process is gone or /proc is unavailable."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024  # reported in kB
    return None


def mib(n: int | float | None) -> float | None:
    return None if n is None else round(n / (1024 * 1024), 1)
