"""The local fleet's supervisor: children start, become ready, and never outlive teardown."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fleet_fixtures import eventually, live_processes

from prefixfleet.fleet.processes import ChildFailedError, Supervisor, redis_ready, start_redis


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (zombies are dead, merely unreaped by PID 1)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    return [p.pid for p in live_processes() if p.pgid == pgid]


async def test_children_and_their_own_children_are_gone_after_teardown(tmp_path: Path) -> None:
    async with Supervisor(tmp_path, stop_timeout_s=2) as sup:
        # a shell that ignores SIGTERM and has a grandchild: only the group SIGKILL ends it
        child = await sup.start("stubborn", ["sh", "-c", "trap '' TERM; sleep 300 & sleep 300; wait"])
        # on a loaded machine the shell may take a while to fork its grandchild: wait (bounded)
        await eventually(
            lambda: group_members(child.pid), 30, "the shell's grandchild", done=lambda pids: len(pids) >= 2
        )
    # SIGKILLed members leave /proc (or turn zombie) when the kernel next schedules them: moments, or
    # longer on a loaded machine (a 2 s loop here was shorter than the 10 s the test below allows)
    await eventually(
        lambda: group_members(child.pid), 30, "the group's members to be gone", done=lambda pids: pids == []
    )
    assert sup.children == []


async def test_a_child_that_dies_before_ready_raises_with_its_log_and_leaves_nothing(tmp_path: Path) -> None:
    marker = "299.4242"  # unique sleep length: finds the grandchild the dead shell left behind
    async with Supervisor(tmp_path) as sup:
        with pytest.raises(ChildFailedError) as err:
            await sup.start(
                "early-death",
                ["sh", "-c", f"sleep {marker} & echo engine exploded; exit 3"],
                health_url="http://127.0.0.1:9/health",
                ready_timeout_s=10,
            )
        assert "early-death" in str(err.value) and "status 3" in str(err.value)
        assert "engine exploded" in err.value.log_tail
        assert (tmp_path / "early-death.log").read_text().strip() == "engine exploded"
        assert sup.children == []
    # The group's SIGKILL is sent before the Supervisor closes; the orphaned grandchild (now init's)
    # dies when the kernel next schedules it, so a loaded machine may still list it for a moment.
    await eventually(
        lambda: [p for p in _all_pids() if f"sleep {marker}" in _cmdline(p)],
        10,
        "the dead shell's grandchild to be killed with its group",
        done=lambda left: not left,
    )


async def test_http_readiness_waits_for_health(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as sup:
        port = sup.allocate_port()
        script = (
            "import http.server, time;"
            "time.sleep(0.5);"
            f"http.server.ThreadingHTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler)"
            ".serve_forever()"
        )
        child = await sup.start(
            "web", [sys.executable, "-c", script], health_url=f"http://127.0.0.1:{port}/", ready_timeout_s=20
        )
        assert child.running
        sup.check_alive()
    assert not alive(child.pid)


async def test_embedded_redis_answers_ping_and_stops(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as sup:
        redis = await start_redis(sup)
        assert redis.url.startswith("redis://127.0.0.1:")
        assert await redis_ready("127.0.0.1", redis.port)
    assert not alive(redis.child.pid)
    assert not await redis_ready("127.0.0.1", redis.port)


async def test_check_alive_reports_a_crashed_child(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as sup:
        child = await sup.start("crasher", ["sh", "-c", "echo bye; exit 7"])
        await child.process.wait()
        with pytest.raises(ChildFailedError, match="status 7"):
            sup.check_alive()


async def test_ports_handed_out_are_distinct(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as sup:
        ports = {sup.allocate_port() for _ in range(20)}
    assert len(ports) == 20


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and alive(int(p.name))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
