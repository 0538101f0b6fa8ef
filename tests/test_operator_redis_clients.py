"""How long the operator keeps its Redis clients, against a real Valkey/Redis (connections counted per
ACL user with CLIENT LIST).

* The operator keeps one client per Redis URL (credentials included), async (membership, the
  autoscaler, a deleted fleet's cleanup) and sync (the reconcile's login, permission check, drains);
  their pools keep connections between calls. Once no fleet uses a URL any more (its credentials or
  Redis changed, it was deleted) both clients are closed: a long-lived operator does not keep one
  client and its connections per URL it ever used.
* A client is not closed under a call in flight on it: the autoscaler's read begun before the fleet
  moved to other credentials ends normally, and the client closes after it.
* A fleet whose login Redis refuses does not disturb another fleet's call on the same client.

The rounds run in-process (``reconcile``, ``fleet_deleted``, the autoscaler's ``_arrived_to``) on the
emulated API server, with kopf's Event posting replaced by a list (no kopf operator runs here).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest
import redis
import redis.asyncio.connection as aioconnection

from prefixfleet.operator.autoscale_handlers import FleetAutoscale, _arrived_to
from prefixfleet.operator.handlers import (
    FleetRedis,
    OperatorContext,
    fleet_deleted,
    probe_verdicts,
    reconcile,
    redis_login_check,
    redis_probe,
    unused_urls,
)
from prefixfleet.operator.planner import FleetRef, replica_name
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import LoadReport, encode_record
from tests.k8s.cluster import EmulatedCluster, wait_for
from tests.test_operator_badinput_redis import Secrets
from tests.test_operator_redis_auth import PASSWORD_REF
from tests.test_operator_redis_permissions import (  # noqa: F401  (acl_redis: a pytest fixture)
    ALL_FLEET_KEYS,
    NAMESPACE,
    PASSWORD,
    AclRedis,
    acl_redis,
    clients_of,
    fleet_manifest,
    in_process_kube,
)

LOG = logging.getLogger("test_operator_redis_clients")


@dataclass
class InProcess:
    """One operator's context on an emulated API server, its handlers called by the test."""

    cluster: EmulatedCluster
    ctx: OperatorContext
    acl: AclRedis
    events: list[tuple[Any, ...]] = field(default_factory=list)  # (args, kwargs) of each Event posted

    async def reconciles(self, fleet: str, user: str, rounds: int = 2) -> None:
        """Apply ``fleet`` dialling Redis as ``user``, then reconcile it ``rounds`` times."""
        self.cluster.apply(fleet_manifest(f"redis://{user}@127.0.0.1:{self.acl.port}/0", fleet))
        for _ in range(rounds):
            await reconcile(self.ctx, NAMESPACE, fleet, LOG)

    async def delete(self, fleet: str, passes: int = 1) -> None:
        """The fleet deleted, as kopf hands it to fleet_deleted (its last body), ``passes`` times
        (kopf processes a deletion again while a timer of the fleet is still exiting)."""
        body = self.cluster.kubectl_json("get", "pcf", fleet)
        self.cluster.kubectl("delete", "pcf", fleet)
        memo = kopf.Memo()
        memo.ctx = self.ctx
        for _ in range(passes):
            await fleet_deleted(body=kopf.Body(body), memo=memo, logger=LOG)

    def url(self, user: str) -> str:
        """What the operator dials for a fleet of ``user`` (the Secret's password in the URL)."""
        return f"redis://{user}:{PASSWORD}@127.0.0.1:{self.acl.port}/0"


@pytest.fixture
async def operator(
    tmp_path: Path,
    acl_redis: AclRedis,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[InProcess]:
    events: list[tuple[Any, ...]] = []
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: events.append((args, kwargs)))
    monkeypatch.setattr(kopf, "info", lambda *args, **kwargs: events.append((args, kwargs)))
    cluster = EmulatedCluster(tmp_path / "cluster")
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    try:
        ctx.kube = in_process_kube(cluster)
        yield InProcess(cluster, ctx, acl_redis, events)
    finally:
        for client in ctx.redis_clients.values():
            await client.aclose()
        for sync_client in ctx.sync_redis_clients.values():
            sync_client.close()
        cluster.close()


def gone(acl: AclRedis, user: str) -> Callable[[], bool]:
    return lambda: clients_of(acl, user) == 0


# ------------------------------------------------------------------ no password in the context's repr


async def test_the_contexts_repr_names_no_password(operator: InProcess) -> None:
    # its client maps, the URL each fleet uses and the calls in flight are all keyed by the URL the
    # operator dials, password included; the context is a dataclass, so its repr printed them
    acl, ctx = operator.acl, operator.ctx
    acl.user("fleet-a", *ALL_FLEET_KEYS)
    await operator.reconciles("guarded", "fleet-a")
    assert ctx.redis_users and ctx.sync_redis_clients and ctx.redis_clients  # all recorded, all kept
    ctx.default_redis_url = operator.url("fleet-a")  # --redis / PREFIXFLEET_REDIS_URL may hold one too
    async with ctx.using_redis(operator.url("fleet-a")):
        assert ctx.redis_calls
        shown = repr(ctx)
    assert PASSWORD not in shown, shown
    assert "reconciles=2" in shown  # still a repr of the context


# ------------------------------------------------------------------ a URL no fleet uses any more


async def test_the_clients_of_a_url_no_fleet_uses_any_more_are_closed(operator: InProcess) -> None:
    acl, ctx = operator.acl, operator.ctx
    for user in ("fleet-a", "fleet-b"):
        acl.user(user, *ALL_FLEET_KEYS)
    await operator.reconciles("guarded", "fleet-a")
    # kept between rounds: the sync client's connection (login, permission check) and the async
    # one's (membership)
    assert clients_of(acl, "fleet-a") == 2
    assert list(ctx.redis_clients) == [operator.url("fleet-a")]

    # new credentials: both of the old URL's connections go (before: the async one stayed for good)
    await operator.reconciles("guarded", "fleet-b")
    wait_for(gone(acl, "fleet-a"), 5, what="fleet-a's connections closed")
    assert clients_of(acl, "fleet-b") == 2
    assert list(ctx.redis_clients) == [operator.url("fleet-b")]

    # another fleet on the same URL shares its clients: they stay while it uses them
    await operator.reconciles("other", "fleet-b")
    assert clients_of(acl, "fleet-b") == 2
    await operator.delete("guarded")
    assert clients_of(acl, "fleet-b") == 2 and list(ctx.redis_clients) == [operator.url("fleet-b")]

    # the last fleet on it deleted: nothing is left open (before: the async client's connection)
    await operator.delete("other")
    wait_for(gone(acl, "fleet-b"), 5, what="fleet-b's connections closed")
    assert ctx.redis_clients == {} and ctx.sync_redis_clients == {} and ctx.redis_users == {}
    assert ctx.redis_calls == {}


def test_only_a_url_no_fleet_uses_and_no_call_is_on_may_be_closed() -> None:
    clients = ["redis://a", "redis://b", "redis://c", "redis://d"]
    used = {"redis://a"}
    assert unused_urls(clients, used, {"redis://b": 1, "redis://c": 0}) == ["redis://c", "redis://d"]
    assert unused_urls(clients, set(clients), {}) == []
    assert unused_urls([], used, {}) == []


# ------------------------------------------------------------------ a call in flight


@dataclass
class HeldRead:
    """Once armed, the next async read of a reply on a connection of ACL user fleet-a waits for
    ``release`` (its command sent, its reply unread: a call in flight); ``holding`` is set then."""

    armed: bool = False
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
def held_read(monkeypatch: pytest.MonkeyPatch) -> HeldRead:
    hold = HeldRead()
    read_response = aioconnection.AbstractConnection.read_response

    async def held(self: aioconnection.AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        if hold.armed and getattr(self, "username", None) == "fleet-a" and not hold.holding.is_set():
            hold.holding.set()
            await asyncio.wait_for(hold.release.wait(), 10)
        return await read_response(self, *args, **kwargs)

    monkeypatch.setattr(aioconnection.AbstractConnection, "read_response", held)
    return hold


async def test_a_client_closes_only_after_the_call_in_flight_on_it(
    operator: InProcess, held_read: HeldRead
) -> None:
    acl, ctx = operator.acl, operator.ctx
    for user in ("fleet-a", "fleet-b"):
        acl.user(user, *ALL_FLEET_KEYS)
    await operator.reconciles("guarded", "fleet-a")
    ref = FleetRef(name="guarded", namespace=NAMESPACE)
    pod = replica_name(ref, 0)
    load = LoadReport(
        seq=1, ts=time.time(), state="ready", engine_ok=True, in_flight=3, queued=0, pending_prefill_tokens=0,
        prefill_tokens_per_s=1000.0, cached_tokens=0, capacity_tokens=0, summary_version=0,
    )  # fmt: skip
    acl.admin.set(FleetKeys(ref.redis_fleet).load(pod), encode_record(load))

    # a new pod's warm-up reads the load records on the URL of the autoscaler's last round
    held_read.armed = True
    state = FleetAutoscale(redis_url=operator.url("fleet-a"))  # (no last round: a read cut short says ())
    arrived = asyncio.create_task(_arrived_to(ctx, state, ref))
    await asyncio.wait_for(held_read.holding.wait(), 10)
    # meanwhile the fleet moves to other credentials: no fleet uses fleet-a's URL any more, but the
    # read is still on its client
    await operator.reconciles("guarded", "fleet-b", rounds=1)
    assert operator.url("fleet-a") in ctx.redis_clients
    wait_for(lambda: clients_of(acl, "fleet-a") == 1, 5, what="only the read's connection left")
    held_read.release.set()
    replicas = await asyncio.wait_for(arrived, 10)
    assert [(r.replica_id, r.in_flight) for r in replicas] == [(pod, 3)]  # the read ended normally
    # and then its client closed
    wait_for(gone(acl, "fleet-a"), 5, what="fleet-a's connections closed after the read")
    assert list(ctx.redis_clients) == [operator.url("fleet-b")] and ctx.redis_calls == {}


# ------------------------------------------------------------------ a refused login


def test_a_refused_login_leaves_another_fleets_call_on_the_client_alone(
    acl_redis: AclRedis,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # two fleets dial the same URL, so share the operator's client; fleet y's permission check is
    # mid-transaction when Redis starts refusing the password (rotated on the server) and fleet x's
    # login, on a new connection, is refused
    url = acl_redis.user("fleet-a", *ALL_FLEET_KEYS, "-hset")
    chosen = FleetRedis(url, dial_url=url)
    spec_redis = {"url": f"redis://fleet-a@127.0.0.1:{acl_redis.port}/0", "passwordSecretRef": PASSWORD_REF}
    ctx = OperatorContext(kube=Secrets({}))  # type: ignore[arg-type]
    for fleet in ("x", "y"):
        ctx.dial_redis(f"{NAMESPACE}/{fleet}", url)
    holding, release = threading.Event(), threading.Event()
    read_response = redis.connection.Connection.read_response

    def held(self: redis.connection.Connection, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "fleet-y" and not holding.is_set():
            holding.set()  # MULTI and PING sent, their replies not read yet
            assert release.wait(10)
        return read_response(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "read_response", held)
    said: list[str] = []
    y = threading.Thread(
        target=lambda: said.append(
            probe_verdicts(chosen, redis_probe(ctx, chosen, FleetRef(name="y", namespace=NAMESPACE)))[0]
        ),
        name="fleet-y",
    )
    try:
        y.start()
        assert holding.wait(10)
        acl_redis.admin.execute_command("ACL", "SETUSER", "fleet-a", "resetpass", ">rotated-Pw-2")
        refused = redis_login_check(ctx, spec_redis, chosen)[0]
        assert refused is not None and "refused" in refused, refused
        release.set()
        y.join(10)
        # y's check ended with its answer (before: its connection was closed under it and the check
        # died, an AttributeError from redis-py reading the closed socket, failing y's whole round)
        assert len(said) == 1 and "HSET on key pf:default.y:members" in said[0], said
        assert ctx.sync_redis_clients.keys() == {url}  # still the fleets' client (closed when unused)
        assert clients_of(acl_redis, "fleet-a") == 1  # y's; the refused one was dropped
    finally:
        release.set()
        y.join(10)
        for client in ctx.sync_redis_clients.values():
            client.close()
