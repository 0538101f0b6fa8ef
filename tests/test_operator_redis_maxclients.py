"""What the operator says when its Redis refuses new connections for its maxclients limit.

Redis (and Valkey) answer a connection beyond ``maxclients`` with ``-ERR max number of clients
reached`` and close it; redis-py raises that as a ConnectionError, and the operator's login check
took it for an outage: nothing said, while every new connection of the fleet's pods was refused the
same. Specification: the fleet is ``Degraded`` with reason ``RedisCommandsRefused`` and a message
naming maxclients, like the other refusals that are not about access: never a verdict on the
credentials (no RedisAccessDenied, no password in the text), one Warning Event when it starts, held
through an outage, cleared once Redis takes the operator's connection again.

A real Valkey/Redis started with ``--maxclients 1``, its one connection held open by the test.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from fleet_fixtures import free_port, redis_server_binary, wait_until

from prefixfleet.operator.handlers import FleetRedis, OperatorContext, redis_login_check
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import REDIS_COMMANDS_REFUSED
from tests.k8s.cluster import emulator_fleet
from tests.test_operator_redis_refusals import FLEET, NAMESPACE
from tests.test_operator_redis_refusals_outage import ctx, kube, round_said

# the fixtures of the outage tests: an emulated API server with the CRD, one operator's context
kube = kube
ctx = ctx
PASSWORD = "maxclients-test-secret"


@dataclass
class FullRedis:
    """A real Valkey/Redis on loopback accepting one client, that one held open by the test."""

    port: int
    directory: Path
    proc: subprocess.Popen | None = None
    held: redis.Redis | None = field(default=None)

    def start(self) -> None:
        argv = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.directory), "--maxclients", "1"]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def hold(self) -> None:
        """Take the server's one connection (once it listens), kept open until :meth:`stop`."""
        self.held = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

        def pings() -> bool:
            with contextlib.suppress(redis.ConnectionError):
                return bool(self.held and self.held.ping())
            return False

        wait_until(pings, 15, "the Redis-compatible server to take the held connection")

    def stop(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def url(self, credentials: str = "") -> str:
        return f"redis://{credentials}127.0.0.1:{self.port}/0"


@pytest.fixture
def full_redis(tmp_path: Path) -> Iterator[FullRedis]:
    server = FullRedis(free_port(), tmp_path)
    server.start()
    try:
        server.hold()
        yield server
    finally:
        server.stop()


def names_maxclients(message: str) -> bool:
    return "max number of clients reached" in message and "maxclients" in message


@pytest.mark.parametrize("credentials", ["", f"fleet:{PASSWORD}@", f":{PASSWORD}@"])
def test_the_login_check_names_maxclients_not_an_outage_nor_a_denial(
    full_redis: FullRedis, credentials: str
) -> None:
    url = full_redis.url(credentials)
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    try:
        login, refused = redis_login_check(ctx, {}, FleetRedis(url, dial_url=url))
    finally:
        for client in ctx.sync_redis_clients.values():
            client.close()
    # no verdict on the credentials (None: the last one stands), and the refusal named (before: "")
    assert login is None
    assert names_maxclients(refused), refused
    assert PASSWORD not in refused and "credentials or ACL" in refused


@pytest.fixture
def full_fleet(ctx: OperatorContext, full_redis: FullRedis) -> OperatorContext:
    """The operator's context, with a fleet on the full Redis in the emulated API server."""
    fleet = emulator_fleet(FLEET, NAMESPACE, {"url": full_redis.url()}, replicas=0)
    ctx.kube.request("POST", Kube.path("PrefixCacheFleet", NAMESPACE), body=json.loads(fleet))
    return ctx


def test_a_fleet_whose_redis_is_full_is_degraded_redis_commands_refused(
    full_fleet: OperatorContext, full_redis: FullRedis
) -> None:
    ctx = full_fleet
    said, first = round_said(ctx)
    # before: Degraded=False (an outage says nothing), no Event
    assert (said, first["status"], first["reason"]) == (
        [REDIS_COMMANDS_REFUSED],
        "True",
        REDIS_COMMANDS_REFUSED,
    )
    assert names_maxclients(first["message"]), first
    status: dict[str, Any] = (ctx.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {})["status"]
    assert not [c for c in status["conditions"] if c["type"] == "RedisAccessDenied" and c["status"] == "True"]
    # the same refusal again: the condition as it was, no second Event
    assert round_said(ctx) == ([], first)

    # an outage (the server gone): the round decides nothing, the verdict stands
    full_redis.stop()
    assert round_said(ctx) == ([], first)
    # Redis back, with room for the operator's connection: the round decides, the condition clears
    full_redis.start()
    said, cleared = wait_until(
        lambda: round_said(ctx),
        15,
        "a round that Redis answers",
        done=lambda r: r[1]["reason"] != REDIS_COMMANDS_REFUSED,
    )
    assert said == [] and not names_maxclients(cleared.get("message", "")), cleared
