"""A fleet process failing under `up`, `compare` or `load`'s fleet is said the way every other CLI
error is: "prefixfleet COMMAND: error: ...", naming the process and where its log is.

It read "prefixfleet: a fleet process failed: redis: exited with status 3 ...": an older prefix
than the CLI's other one-line errors ("prefixfleet up: error: ..."), without the command and
without the log's path (only its last lines). The last lines still follow the one line.

The failure here is real: the Redis-compatible server the fleet starts first is a script that
prints a line and exits 3, so the supervisor sees it die before it is ready (no timing involved).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from prefixfleet.cli import main
from prefixfleet.fleet import local, processes
from prefixfleet.fleet.cli import fleet_failure

TINY = ["--replicas", "1", "--run-dir"]


@pytest.fixture
def failing_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake-redis-server"
    script.write_text("#!/bin/sh\necho 'fatal: this server refuses to start'\nexit 3\n")
    script.chmod(0o755)
    monkeypatch.setattr(processes, "redis_server_binary", lambda: script)
    return script


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--requests", "2", "--gateways", "1", "--no-sim-check", "--no-progress"],
        ["compare", "--requests", "2", "--no-progress", "--json", "compare.json"],
    ],
    ids=["up", "compare"],
)
def test_a_fleet_process_that_dies_is_named_with_its_log(
    argv: list[str],
    tmp_path: Path,
    failing_redis: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # compare's --json, if it were ever written
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main([*argv, *TINY, str(run_dir)])
    assert exit_.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    log = run_dir / "redis.log"
    assert lines[0] == (
        f"prefixfleet {argv[0]}: error: fleet process redis: exited with status 3 before it was ready "
        f"(log: {log})"
    )
    assert lines[1:] == ["--- last lines of redis's log ---", "fatal: this server refuses to start"]
    assert log.read_text().strip() == "fatal: this server refuses to start"


def test_sigterm_names_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def cancelled(main_: object) -> None:  # what run_until_signalled raises once SIGTERM stopped the fleet
        raise asyncio.CancelledError

    monkeypatch.setattr(processes, "run_until_signalled", cancelled)
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--requests", "2", "--no-sim-check", "--no-progress", *TINY, str(tmp_path / "run")])
    assert exit_.value.code == 143
    err = capsys.readouterr().err
    assert err == "prefixfleet up: stopped by SIGTERM; every process it started was stopped\n"


async def test_a_gateway_missing_workers_is_named_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was raised as process "gateway" (which of them?) without a log, though the gateway's log
    # says why it left workers out.
    async def no_workers(session: object, url: str) -> int:
        return 0

    monkeypatch.setattr(local, "_gateway_worker_count", no_workers)
    log = tmp_path / "gateway-0-round_robin.log"
    gateway = SimpleNamespace(
        url="http://127.0.0.1:9", name="gateway-0-round_robin", log_path=log, log_tail=lambda: "w0: no member"
    )
    fleet = SimpleNamespace(replicas=[object(), object()], gateways=[gateway])
    with pytest.raises(processes.ChildFailedError) as err:
        # timeout 0: the deadline has passed at the first look, so no waiting
        await local.LocalFleet.wait_for_membership(fleet, timeout_s=0)  # type: ignore[arg-type]
    assert fleet_failure("prefixfleet up", err.value).splitlines() == [
        "prefixfleet up: error: fleet process gateway-0-round_robin: http://127.0.0.1:9 sees 0 of 2 workers "
        f"after 0s (log: {log})",
        "--- last lines of gateway-0-round_robin's log ---",
        "w0: no member",
    ]
