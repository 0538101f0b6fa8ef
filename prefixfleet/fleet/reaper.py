"""Replicas of the local fleet whose process exited without being asked to (SIGKILL, OOM, a crash).

A sidecar deregisters itself from Redis only on a clean shutdown: one killed hard stays in the
members hash, and gateways keep counting it among their workers for good. In Kubernetes the
operator's membership reconcile removes a member whose pod is gone; this is the local fleet's
counterpart. :func:`plan_reaping` decides, over plain data, which replicas are dead and whether each
comes back; :class:`ReplicaReaper` polls the supervisor's children and carries the decisions out:

* the replica's surviving process is stopped and it leaves :attr:`LocalFleet.replicas`;
* its member entry, load record and summary are removed from Redis, as its sidecar would have done
  (:func:`~prefixfleet.router.keys.deregister_worker`, the sidecar's own way out);
* without the autoscaler it is restarted once under the same name (a Pod's ``restartPolicy:
  Always``, without the back-off): one that dies again within :data:`RESTART_WINDOW_S` of its
  restart stays down. With the autoscaler nothing is restarted here: the planner sees one replica
  fewer and adds one if the fleet is below ``minReplicas`` (or the load asks for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from prefixfleet.cancellation import cancel_and_wait
from prefixfleet.fleet.processes import Child, ChildFailedError
from prefixfleet.router.keys import FleetKeys, deregister_worker
from prefixfleet.router.redis_conn import redis_error_text

if TYPE_CHECKING:
    from prefixfleet.fleet.local import LocalFleet, Replica

RESTART_WINDOW_S = 10.0  # a replica dying again this soon after its restart is not restarted again
POLL_INTERVAL_S = 0.25  # gateways refresh every 0.2 s: a dead member goes within about half a second
REDIS_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class ProcessState:
    """One process of a replica as the supervisor sees it."""

    role: str  # "sidecar" or "engine"
    exit_code: int | None  # None while it runs; negative: killed by that signal
    stop_requested: bool = False  # the supervisor is stopping it on purpose


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    name: str  # the worker id, replica-<k>
    processes: tuple[ProcessState, ...]


@dataclass(frozen=True, slots=True)
class Reaping:
    """What to do about one dead replica."""

    name: str
    exited: tuple[ProcessState, ...]  # its processes that exited unasked
    restart: bool
    why: str  # the restart decision, for the log line

    def line(self) -> str:
        died = " and ".join(f"{p.role} exited with code {describe_exit(p.exit_code)}" for p in self.exited)
        return f"{self.name}: {died}; removed from membership; {self.why}"


def describe_exit(code: int | None) -> str:
    """``-9 (SIGKILL)`` for a signal, the plain status otherwise."""
    if code is None or code >= 0:
        return str(code)
    try:
        return f"{code} ({signal.Signals(-code).name})"
    except ValueError:
        return str(code)


def plan_reaping(
    replicas: Sequence[ReplicaStatus],
    restarted_at: Mapping[str, float],
    now: float,
    *,
    restart: bool,
    window_s: float = RESTART_WINDOW_S,
) -> list[Reaping]:
    """The replicas with a process that exited without being asked to, and whether each restarts.

    A replica being stopped on purpose (any of its processes) is someone else's business: the
    autoscaler draining it, or the fleet's teardown. ``restarted_at`` is when each replica last came
    back from a restart (same clock as ``now``).
    """
    out = []
    for replica in replicas:
        if any(p.stop_requested for p in replica.processes):
            continue
        exited = tuple(p for p in replica.processes if p.exit_code is not None)
        if not exited:
            continue
        since = now - restarted_at[replica.name] if replica.name in restarted_at else None
        if not restart:
            decision, why = False, "not restarted: the autoscaler replaces replicas"
        elif since is not None and since < window_s:
            decision = False
            why = f"not restarted again: it died {since:.1f}s after its restart (within {window_s:g}s)"
        else:
            decision, why = True, "restarting it"
        out.append(Reaping(replica.name, exited, decision, why))
    return out


def _process_state(role: str, child: Child) -> ProcessState:
    return ProcessState(role, child.process.returncode, child.stop_requested)


def replica_status(replica: Replica) -> ReplicaStatus:
    processes = [_process_state("sidecar", replica.sidecar)] if replica.sidecar is not None else []
    processes.append(_process_state("engine", replica.engine))
    return ReplicaStatus(replica.worker_id, tuple(processes))


@dataclass(frozen=True, slots=True)
class ReaperEvent:
    at_s: float
    action: str  # reaped, restarted, restart_failed, error
    detail: str


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class ReplicaReaper:
    """Polls ``fleet``'s replica processes every ``interval_s`` and reaps the dead ones."""

    fleet: LocalFleet
    restart: bool = True
    interval_s: float = POLL_INTERVAL_S
    window_s: float = RESTART_WINDOW_S
    say: Callable[[str], None] = _to_stderr
    restarted_at: dict[str, float] = field(default_factory=dict)  # monotonic, per replica name
    events: list[ReaperEvent] = field(default_factory=list)
    reaped: int = 0
    restarts: int = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReplicaReaper]:
        """Reap in the background for the duration of the block; the supervisor's liveness check
        leaves replica processes to us meanwhile."""
        sup = self.fleet.sup
        before = sup.exit_handled
        sup.exit_handled = self.fleet.is_replica_process
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop))
        try:
            yield self
        finally:
            stop.set()
            if await cancel_and_wait([task]):
                self._event("error", "the reaper did not stop; leaving it")
            sup.exit_handled = before

    async def run(self, stop: asyncio.Event) -> None:
        redis = aioredis.from_url(self.fleet.redis_url, socket_timeout=REDIS_TIMEOUT_S)
        try:
            pause = self.interval_s
            while not stop.is_set():
                try:
                    await self.sweep(redis)
                    pause = self.interval_s
                except Exception as exc:  # a bug must not end the reaping: the dead would stay members
                    self._event("error", f"sweep failed: {exc.__class__.__name__}: {redis_error_text(exc)}")
                    pause = min(max(pause * 2, 1.0), 5.0)  # bounded backoff while it persists
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
        finally:
            await redis.aclose()

    async def sweep(self, redis: aioredis.Redis) -> list[Reaping]:
        """One poll: find the dead replicas, take them out, restart the ones that should be."""
        statuses = [replica_status(r) for r in self.fleet.replicas]
        plan = plan_reaping(
            statuses, self.restarted_at, time.monotonic(), restart=self.restart, window_s=self.window_s
        )
        by_name = {r.worker_id: r for r in self.fleet.replicas}
        for reaping in plan:
            await self._remove(by_name[reaping.name], redis, reaping)
        await asyncio.gather(*(self._restart(by_name[r.name].index) for r in plan if r.restart))
        return plan

    def _event(self, action: str, detail: str) -> None:
        self.events.append(ReaperEvent(time.time(), action, detail))
        self.say(detail)

    async def _remove(self, replica: Replica, redis: aioredis.Redis, reaping: Reaping) -> None:
        await self.fleet.stop_replica(replica)  # the survivor; the dead one is only collected
        try:
            keys = FleetKeys(self.fleet.spec.fleet_name)
            await asyncio.wait_for(deregister_worker(redis, keys, replica.worker_id), REDIS_TIMEOUT_S)
        except (RedisError, OSError, TimeoutError) as exc:
            said = redis_error_text(exc)
            self._event("error", f"{replica.worker_id}: could not remove its member from Redis: {said}")
        # Only now: while it is in the list its index is taken, so the autoscaler cannot start a new
        # replica under its name whose member entry the deregistration above would then delete.
        if replica in self.fleet.replicas:  # (the autoscaler may have let go of it meanwhile)
            self.fleet.replicas.remove(replica)
        self.reaped += 1
        self._event("reaped", reaping.line())

    async def _restart(self, index: int) -> None:
        try:
            replica = await self.fleet.start_replica(index)
        except (ChildFailedError, RuntimeError, OSError) as exc:  # no port, no binary, not ready
            self._event("restart_failed", f"replica-{index}: restart failed: {str(exc).splitlines()[0]}")
            return
        self.fleet.add_replica(replica)
        self.restarted_at[replica.worker_id] = time.monotonic()
        self.restarts += 1
        self._event(
            "restarted",
            f"{replica.worker_id}: restarted, engine {replica.engine_url}, sidecar {replica.sidecar_url}",
        )
