"""``prefixfleet emulator-bench`` counts failed requests and names a dead emulator, never a traceback.

Before, the closed-loop client let any connection error escape (``ServerDisconnectedError`` when the
emulator died mid-run, then ``ProcessLookupError`` from terminating the dead process), and read every
answer as JSON before looking at its status (a plain-text 500 was a ``ContentTypeError``).
"""

from __future__ import annotations

import itertools
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import (
    LiveProcess,
    kill_left_behind,
    live_children,
    prefixfleet_argv,
    serve_aiohttp,
    wait_stopped,
    wait_until,
)

from prefixfleet.cli import UsageError
from prefixfleet.emulator import bench
from prefixfleet.emulator.config import EmulatorConfig

pytestmark = pytest.mark.timeout(120)


async def test_failed_requests_are_counted_and_kept_out_of_the_latencies() -> None:
    turn = itertools.count()

    async def flaky(request: web.Request) -> web.StreamResponse:
        await request.read()
        i = next(turn)
        if i % 3 == 0:
            return web.Response(status=500, text="Internal Server Error")  # not JSON
        if i % 3 == 1:
            assert request.transport is not None
            request.transport.abort()  # a reset, as from a dying process
            return web.Response()
        return web.json_response({"meta_info": {"e2e_latency": 0.001}})

    app = web.Application()
    app.router.add_post("/generate", flaky)
    async with serve_aiohttp(app) as url, aiohttp.ClientSession() as http:
        report = await bench._closed_loop(http, url, EmulatorConfig(time_scale=1.0), 9, 1, 1)
    assert report["errors"] == 6, report
    assert report["wall_e2e_ms_mean"] is not None and report["client_overhead_ms_p50"] is not None


async def test_an_emulator_that_dies_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real_wait = bench._wait_healthy

    async def healthy_then_killed(http, url, proc) -> None:  # type: ignore[no-untyped-def]
        await real_wait(http, url, proc)
        proc.send_signal(signal.SIGKILL)  # the process this test's emulator-bench started
        await proc.wait()

    monkeypatch.setattr(bench, "_wait_healthy", healthy_then_killed)
    with pytest.raises(UsageError, match=r"emulator .*exited with -9"):
        await bench.http_run(EmulatorConfig(time_scale=50.0), 5, 2, 1)


def test_sigterm_stops_the_emulator_process_the_benchmark_started(tmp_path: Path) -> None:
    # Before: SIGTERM ended emulator-bench at once (status -15) and left its emulator running.
    log_path = tmp_path / "bench.log"
    argv = prefixfleet_argv("emulator-bench", "--requests", "100000", "--time-scale", "1")
    with log_path.open("wb") as log:
        bench_proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    emulators: list[LiveProcess] = []
    try:
        emulators = wait_until(lambda: live_children(bench_proc.pid), 60, "emulator-bench's emulator")
        wait_until(lambda: b"emulator-bench http" in log_path.read_bytes(), 60, "the requests to start")
        bench_proc.send_signal(signal.SIGTERM)
        assert bench_proc.wait(timeout=30) == 143, log_path.read_text(errors="replace")
        wait_stopped(emulators, 15, "the emulator to be stopped")
    finally:
        if bench_proc.poll() is None:
            bench_proc.kill()
            bench_proc.wait()
        kill_left_behind(emulators)  # started by this test's emulator-bench: never left behind
