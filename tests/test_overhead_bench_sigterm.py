"""``prefixfleet router bench-overhead`` stopped by SIGTERM stops the processes it started.

Before, SIGTERM (timeout(1), a CI job cancelled) ended the benchmark at once (status -15) and left
its Valkey, emulator, sidecar and gateway running on their ports, each in its own session.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from fleet_fixtures import (
    LiveProcess,
    kill_left_behind,
    live_children,
    prefixfleet_argv,
    wait_stopped,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


def test_sigterm_stops_every_process_bench_overhead_started(tmp_path: Path) -> None:
    log_path = tmp_path / "bench.log"
    argv = prefixfleet_argv("router", "bench-overhead", "--requests", "100000", "--no-progress")
    with log_path.open("wb") as log:
        bench = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    children: list[LiveProcess] = []
    try:
        children = wait_until(
            lambda: live_children(bench.pid), 60, "its 4 processes", done=lambda c: len(c) == 4
        )
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=40) != -signal.SIGTERM, "killed by SIGTERM with no teardown"
        assert "stopped by SIGTERM" in log_path.read_text(errors="replace")
        wait_stopped(children, 20, "its processes to be stopped")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        kill_left_behind(children)  # started by this test's benchmark (each its group): never left behind
