"""A fleet's Redis verdict (RedisAuthFailed, RedisPermissionDenied) across an outage of its Redis,
against a real Valkey/Redis that is stopped and started again on the same port.

Specification:

* a round that cannot reach Redis (connection refused: the server is down) decides nothing about
  the credentials or the ACL: the fleet's Degraded condition stays as it was (reason, message,
  transition time) and no Warning Event is posted; a fleet that was fine stays fine;
* the first round that reaches Redis again decides as ever: the same refusal keeps the condition
  (still no new Event), fixed credentials or a granted command clear it.

Before, the outage round's "no answer" read as "no problem": the condition cleared and came back,
with a second Warning Event, once Redis answered again.

The rounds run in-process (``reconcile``) on the emulated API server, kopf's Event posting replaced by
a list, as in tests/test_operator_redis_clients.py. Also here: the shutdown cleanup closes the
operator's clients while calls on them may still end (``close_clients``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest
import redis
from fleet_fixtures import free_port

from prefixfleet.fleet.processes import redis_server_binary
from prefixfleet.operator.handlers import OperatorContext, close_clients, reconcile
from prefixfleet.operator.planner import REDIS_AUTH_FAILED, REDIS_PERMISSION_DENIED, redis_verdict
from tests.k8s.cluster import EmulatedCluster, wait_for
from tests.test_operator_redis_permissions import (
    ALL_FLEET_KEYS,
    NAMESPACE,
    PASSWORD,
    fleet_manifest,
    in_process_kube,
)

LOG = logging.getLogger("test_operator_redis_outage")
FLEET = "guarded"


@dataclass
class StoppableRedis:
    """A Valkey/Redis on a fixed loopback port that the test stops and starts again (no persistence:
    a restarted server has only its default user, as after a crash without a saved ACL file)."""

    port: int
    workdir: Path
    server: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [str(redis_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir)]  # fmt: skip
        self.server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.pings, 15, what="the Redis-compatible server")

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(10)
            self.server = None
        assert not self.pings()  # refused now: an outage, not a refusal of the credentials

    def pings(self) -> bool:
        try:
            with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2) as admin:
                return bool(admin.ping())
        except redis.ConnectionError:
            return False

    def acl(self, *args: str) -> None:
        with redis.Redis(host="127.0.0.1", port=self.port) as admin:
            admin.execute_command("ACL", *args)

    def user(self, name: str, *rules: str) -> None:
        """ACL user ``name`` with the fleet Secret's password and ``rules``."""
        self.acl("SETUSER", name, "reset", "on", f">{PASSWORD}", *rules)


@dataclass
class Operator:
    cluster: EmulatedCluster
    ctx: OperatorContext
    redis: StoppableRedis
    events: list[dict[str, Any]] = field(default_factory=list)

    async def round(self) -> dict[str, Any] | None:
        """One reconcile of the fleet; its Degraded condition when True."""
        await reconcile(self.ctx, NAMESPACE, FLEET, LOG)
        got = self.ctx.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {}
        conditions = (got.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)

    def warnings(self, reason: str) -> int:
        return sum(e.get("type") == "Warning" and e.get("reason") == reason for e in self.events)


@pytest.fixture
def stoppable_redis(tmp_path: Path) -> Iterator[StoppableRedis]:
    server = StoppableRedis(free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.server is not None:
            server.server.terminate()
            server.server.wait(10)


@pytest.fixture
async def operator(
    tmp_path: Path, stoppable_redis: StoppableRedis, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Operator]:
    async with in_process_operator(EmulatedCluster(tmp_path / "cluster"), stoppable_redis, monkeypatch) as op:
        yield op


@contextlib.asynccontextmanager
async def in_process_operator(
    cluster: EmulatedCluster, server: StoppableRedis, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Operator]:
    """The fleet on ``cluster`` (closed on the way out), dialling ``server`` as user fleet-a."""
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    op = Operator(cluster, ctx, server)
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: op.events.append(kwargs))
    monkeypatch.setattr(kopf, "info", lambda *args, **kwargs: None)
    try:
        ctx.kube = in_process_kube(cluster)
        cluster.apply(fleet_manifest(f"redis://fleet-a@127.0.0.1:{server.port}/0", FLEET))
        yield op
    finally:
        memo = kopf.Memo()
        memo.ctx = ctx
        await close_clients(memo=memo)  # the operator's own shutdown cleanup
        cluster.close()


# ------------------------------------------------------------------ across an outage (in-process)


async def test_a_refused_login_stays_said_through_an_outage_without_a_second_event(
    operator: Operator,
) -> None:
    server = operator.redis
    server.user("fleet-a", *ALL_FLEET_KEYS)
    assert await operator.round() is None
    server.acl("SETUSER", "fleet-a", "resetpass", ">not-the-secrets-password")
    refused = await operator.round()
    assert refused is not None and refused["reason"] == REDIS_AUTH_FAILED, refused
    assert operator.warnings(REDIS_AUTH_FAILED) == 1

    server.stop()
    for _ in range(2):
        # before: cleared here ("no answer" read as "accepted")
        assert await operator.round() == refused
    # Redis back without that user (no saved ACL): refused alike, the same message, still one Event
    server.start()
    assert await operator.round() == refused
    assert operator.warnings(REDIS_AUTH_FAILED) == 1  # before: 2, the refusal raised anew
    # the user back with the Secret's password: the next round clears it
    server.user("fleet-a", *ALL_FLEET_KEYS)
    assert await operator.round() is None
    assert operator.warnings(REDIS_AUTH_FAILED) == 1


async def test_a_denied_command_stays_said_through_an_outage_without_a_second_event(
    operator: Operator,
) -> None:
    server = operator.redis
    server.user("fleet-a", *ALL_FLEET_KEYS, "-hset")
    denied = await operator.round()
    assert denied is not None and denied["reason"] == REDIS_PERMISSION_DENIED, denied
    assert "HSET" in denied["message"]
    assert operator.warnings(REDIS_PERMISSION_DENIED) == 1

    server.stop()
    assert await operator.round() == denied  # before: cleared
    server.start()
    server.user("fleet-a", *ALL_FLEET_KEYS, "-hset")
    assert await operator.round() == denied
    assert operator.warnings(REDIS_PERMISSION_DENIED) == 1  # before: 2
    server.user("fleet-a", *ALL_FLEET_KEYS)  # granted
    assert await operator.round() is None


async def test_a_fleet_that_was_fine_stays_fine_through_an_outage(operator: Operator) -> None:
    server = operator.redis
    server.user("fleet-a", *ALL_FLEET_KEYS)
    assert await operator.round() is None
    server.stop()
    assert await operator.round() is None
    assert not [e for e in operator.events if e.get("type") == "Warning"]


# ------------------------------------------------------------------ the decision (pure)

AUTH = {"type": "Degraded", "status": "True", "reason": REDIS_AUTH_FAILED, "message": "refused"}
DENIED = {"type": "Degraded", "status": "True", "reason": REDIS_PERMISSION_DENIED, "message": "denied"}
OTHER = {"type": "Degraded", "status": "True", "reason": "ReplicaFailed", "message": "replaced"}
CLEARED = {"type": "Degraded", "status": "False", "reason": REDIS_AUTH_FAILED, "message": "refused"}
READY = {"type": "Ready", "status": "True", "reason": REDIS_AUTH_FAILED, "message": "not Degraded"}


@pytest.mark.parametrize(
    ("login", "permissions", "previous", "verdict"),
    [
        # Redis did not answer the login: the last verdict stands, whichever it was
        (None, "", [READY, AUTH], ("refused", "")),
        (None, "", [DENIED], ("", "denied")),
        (None, "", [OTHER], ("", "")),
        (None, "", [CLEARED, READY], ("", "")),  # only a Degraded condition that is True holds one
        (None, "", [], ("", "")),
        # the login was accepted, then the permission check got no answer: a refusal is over
        ("", None, [DENIED], ("", "denied")),
        ("", None, [AUTH], ("", "")),
        # Redis answered: it decides alone
        ("now refused", "", [DENIED], ("now refused", "")),
        ("", "", [AUTH], ("", "")),
        ("", "", [DENIED], ("", "")),
        ("", "now denied", [AUTH], ("", "now denied")),
    ],
)
def test_the_verdict_of_a_round_that_reached_redis_or_not(
    login: str | None, permissions: str | None, previous: list[dict[str, str]], verdict: tuple[str, str]
) -> None:
    assert redis_verdict(login, permissions, previous) == verdict


# ------------------------------------------------------------------ shutdown


class ClosingClient:
    """An async client whose close lets another task run (as redis-py's aclose may)."""

    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    async def aclose(self) -> None:
        await asyncio.sleep(0.05)
        self.closed.append(self.name)


async def test_the_shutdown_cleanup_closes_every_client_while_a_call_ends() -> None:
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    closed: list[str] = []
    ctx.redis_clients["redis://a"] = ClosingClient(closed, "a")  # type: ignore[assignment]
    ctx.redis_clients["redis://c"] = ClosingClient(closed, "c")  # type: ignore[assignment]
    ctx.redis_users.update({"default/a": "redis://a", "default/c": "redis://c"})  # in use: kept
    ends = asyncio.Event()

    async def call_in_flight() -> None:
        async with ctx.using_redis("redis://b"):  # no fleet uses it: closed once the call ends
            await ends.wait()

    call = asyncio.create_task(call_in_flight())
    await asyncio.sleep(0)
    assert "redis://b" in ctx.redis_clients
    memo = kopf.Memo()
    memo.ctx = ctx
    # the call ends while the cleanup awaits the first client's close, and takes its client out
    asyncio.get_running_loop().call_later(0.01, ends.set)
    await close_clients(memo=memo)  # before: RuntimeError, dictionary changed size during iteration
    await call
    assert sorted(closed) == ["a", "c"] and "redis://b" not in ctx.redis_clients
