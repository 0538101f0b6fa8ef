"""A password changed on the fleet's Redis while the operator keeps its connection open, against a
real Valkey/Redis.

The operator keeps one pooled connection per Redis URL across reconciles (login, permission check),
logged in when it was dialled, and Redis keeps a connection logged in when the user's password
changes. The fleet's sidecars and gateways, dialling new connections, are refused from then on.
Specification:

* every round proves the credentials (an AUTH with them on the connection it uses; none for a URL
  without a password): the round after the password changed on the server (``ACL SETUSER u
  resetpass >new``, or ``CONFIG SET requirepass`` for the default user) says ``RedisAuthFailed``,
  and so does every later one, on whichever pooled connection it lands (two fleets on one URL);
* the connections logged in with the refused credentials are closed, not kept for the next call;
* once the Secret holds the new password the condition clears; still one connection kept per URL;
* a URL naming a user logs in to a Redis older than 6 (no users) with the password alone, as the
  pods' redis-py (before 8) does, each round as when it connects;
* the same over TLS;
* a fleet whose spec turns invalid dials nothing: its URL is no longer recorded, so that URL's
  connections close (before: kept until the spec was valid again).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from prefixfleet.operator.handlers import OperatorContext, fleet_redis, reconcile, redis_login_check
from prefixfleet.operator.planner import REDIS_AUTH_FAILED
from prefixfleet.operator.redis_permissions import NO_PASSWORD_PROBE
from tests.k8s.cluster import wait_for
from tests.test_operator_badinput_redis import Secrets
from tests.test_operator_redis_auth import PASSWORD as GUARDED_PASSWORD
from tests.test_operator_redis_auth import (  # noqa: F401  (guarded_redis: a pytest fixture)
    PASSWORD_REF,
    guarded_redis,
    password_secret,
)
from tests.test_operator_redis_clients import (  # noqa: F401  (operator: a pytest fixture)
    LOG,
    InProcess,
    operator,
)
from tests.test_operator_redis_permissions import (  # noqa: F401  (acl_redis: a pytest fixture)
    ALL_FLEET_KEYS,
    NAMESPACE,
    PASSWORD,
    AclRedis,
    acl_redis,
    clients_of,
)

ROTATED = "rotated-Pw-0b3d"
SECRET = PASSWORD_REF["name"]
REFUSED = "spec.redis.passwordSecretRef: the password in Secret 'fleet-redis-password' key 'password':"


def rotate(acl: AclRedis, user: str) -> None:
    """The user's password changed on the server: connections logged in before stay logged in."""
    acl.admin.execute_command("ACL", "SETUSER", user, "resetpass", f">{ROTATED}")


def degraded(in_process: InProcess, fleet: str) -> dict[str, Any] | None:
    got = in_process.ctx.kube.get("PrefixCacheFleet", NAMESPACE, fleet) or {}
    conditions = (got.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)


def auth_calls(admin: redis.Redis) -> int:
    """AUTH commands the server has run (INFO commandstats)."""
    return int(admin.info("commandstats").get("cmdstat_auth", {}).get("calls", 0))


def connections_received(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


# ------------------------------------------------------------------ reconciles (in-process)


async def test_a_password_rotated_on_the_server_is_said_the_next_round_and_clears_with_the_secret(
    operator: InProcess,  # noqa: F811
) -> None:
    acl, ctx = operator.acl, operator.ctx
    acl.user("fleet-a", *ALL_FLEET_KEYS)
    await operator.reconciles("guarded", "fleet-a", rounds=2)
    assert degraded(operator, "guarded") is None
    assert clients_of(acl, "fleet-a") == 2  # kept: the sync client's (login, probe), the async one's

    rotate(acl, "fleet-a")
    await reconcile(ctx, NAMESPACE, "guarded", LOG)
    # the very next round (before: PING answered on the kept connection, round after round)
    cond = degraded(operator, "guarded")
    assert cond is not None and cond["reason"] == REDIS_AUTH_FAILED, cond
    assert cond["message"].startswith(REFUSED) and "refused" in cond["message"], cond
    assert PASSWORD not in cond["message"] and ROTATED not in cond["message"]
    # the sync connection logged in with the old password is closed; the async one (membership) is
    # not dialled while the login is refused and goes with its client once the URL changes
    assert clients_of(acl, "fleet-a") == 1
    await reconcile(ctx, NAMESPACE, "guarded", LOG)
    assert (degraded(operator, "guarded") or {}).get("reason") == REDIS_AUTH_FAILED

    # the Secret updated: the new password is another URL, the old URL's connections all go
    operator.cluster.apply(password_secret(ROTATED))
    await reconcile(ctx, NAMESPACE, "guarded", LOG)
    assert degraded(operator, "guarded") is None
    wait_for(lambda: clients_of(acl, "fleet-a") == 2, 5, what="only the new URL's two connections")
    assert list(ctx.sync_redis_clients) == [f"redis://fleet-a:{ROTATED}@127.0.0.1:{acl.port}/0"]


async def test_an_invalid_spec_records_no_url_so_its_connections_close(
    operator: InProcess,  # noqa: F811
) -> None:
    acl, ctx, cluster = operator.acl, operator.ctx, operator.cluster
    acl.user("fleet-a", *ALL_FLEET_KEYS)
    await operator.reconciles("guarded", "fleet-a", rounds=2)
    assert clients_of(acl, "fleet-a") == 2
    # a spec the operator refuses (one that got past a server without schema validation)
    cluster.api.server.validate_custom_resources = False
    cluster.kubectl("patch", "pcf", "guarded", "--type", "merge", "-p", '{"spec":{"engine":{"kind":"tpu"}}}')
    await reconcile(ctx, NAMESPACE, "guarded", LOG)
    assert (degraded(operator, "guarded") or {}).get("reason") == "InvalidSpec"
    # nothing dials the fleet's Redis now (before: its URL stayed recorded, its connections open)
    wait_for(lambda: clients_of(acl, "fleet-a") == 0, 5, what="fleet-a's connections closed")
    assert ctx.redis_users == {} and ctx.sync_redis_clients == {} and ctx.redis_clients == {}
    # valid again: dialled again
    cluster.kubectl(
        "patch", "pcf", "guarded", "--type", "merge", "-p", '{"spec":{"engine":{"kind":"emulator"}}}'
    )
    await reconcile(ctx, NAMESPACE, "guarded", LOG)
    assert degraded(operator, "guarded") is None and clients_of(acl, "fleet-a") == 2


# ------------------------------------------------------------------ the login check


@pytest.fixture
def ctx() -> Iterator[OperatorContext]:
    """One operator's context (its Secrets set by the test), kept across the rounds of a test."""
    context = OperatorContext(kube=Secrets({SECRET: {"password": PASSWORD}}))  # type: ignore[arg-type]
    yield context
    for client in context.sync_redis_clients.values():
        client.close()


def login_round(ctx: OperatorContext, fleet: str, spec_redis: dict[str, Any]) -> str | None:
    """A fleet's login check as its reconcile makes it: the URL recorded, then dialled."""
    chosen = fleet_redis(ctx, NAMESPACE, spec_redis)
    ctx.dial_redis(f"{NAMESPACE}/{fleet}", chosen.dial_url)
    return redis_login_check(ctx, spec_redis, chosen)[0]


def test_two_fleets_on_one_url_are_both_refused_whichever_kept_connection_they_get(
    acl_redis: AclRedis,  # noqa: F811
    ctx: OperatorContext,
) -> None:
    acl_redis.user("fleet-a", *ALL_FLEET_KEYS)
    spec_redis = {"url": f"redis://fleet-a@127.0.0.1:{acl_redis.port}/0", "passwordSecretRef": PASSWORD_REF}
    # their rounds overlapped once: the shared client's pool keeps two logged-in connections
    assert login_round(ctx, "x", spec_redis) == ""
    (client,) = ctx.sync_redis_clients.values()
    held = client.connection_pool.get_connection()
    assert login_round(ctx, "y", spec_redis) == ""
    client.connection_pool.release(held)
    assert clients_of(acl_redis, "fleet-a") == 2

    rotate(acl_redis, "fleet-a")
    said = [login_round(ctx, fleet, spec_redis) for fleet in ("x", "y", "x", "y")]
    # each round, on a kept connection or a new one (before: "" on the kept ones)
    assert all(s is not None and s.startswith(REFUSED) for s in said), said
    assert clients_of(acl_redis, "fleet-a") == 0  # none left logged in with the old password

    ctx.kube.secrets[SECRET] = {"password": ROTATED}  # type: ignore[attr-defined]
    assert [login_round(ctx, fleet, spec_redis) for fleet in ("x", "y", "x")] == ["", "", ""]
    assert clients_of(acl_redis, "fleet-a") == 1 and len(ctx.sync_redis_clients) == 1


def test_the_default_users_password_changed_with_requirepass_is_refused_the_next_round(
    guarded_redis: str,  # noqa: F811  (requirepass: the default user's password, no ACL users)
    ctx: OperatorContext,
) -> None:
    ctx.kube.secrets[SECRET] = {"password": GUARDED_PASSWORD}  # type: ignore[attr-defined]
    admin = redis.Redis.from_url(guarded_redis, password=GUARDED_PASSWORD)
    spec_redis = {"url": guarded_redis, "passwordSecretRef": PASSWORD_REF}
    try:
        auths, dialled = auth_calls(admin), connections_received(admin)
        assert [login_round(ctx, "x", spec_redis) for _ in range(3)] == ["", "", ""]
        # one connection, kept; one AUTH (the password alone: no user) per round on it (the server does
        # not count the AUTH a new connection logs in with)
        assert connections_received(admin) - dialled == 1
        assert auth_calls(admin) - auths == 3

        admin.config_set("requirepass", ROTATED)
        said = login_round(ctx, "x", spec_redis)
        assert said is not None and said.startswith(REFUSED), said
        ctx.kube.secrets[SECRET] = {"password": ROTATED}  # type: ignore[attr-defined]
        assert login_round(ctx, "x", spec_redis) == ""
    finally:
        admin.close()


def test_a_password_set_on_a_redis_that_had_none_is_said_the_next_round(
    acl_redis: AclRedis,  # noqa: F811
    ctx: OperatorContext,
) -> None:
    spec_redis = {"url": f"redis://127.0.0.1:{acl_redis.port}/0"}  # no password anywhere
    auths, dialled = auth_calls(acl_redis.admin), connections_received(acl_redis.admin)
    assert [login_round(ctx, "x", spec_redis) for _ in range(3)] == ["", "", ""]
    # one connection kept; each round's AUTH is the no-password probe, accepted by the default user
    assert connections_received(acl_redis.admin) - dialled == 1
    assert auth_calls(acl_redis.admin) - auths == 3
    assert clients_of(acl_redis, "default") == 2  # the admin's and the kept one

    # the default user now needs a password: the kept connection stays logged in (its PING is still
    # answered), every new connection of the fleet's pods is refused (before: "" round after round)
    acl_redis.admin.execute_command("ACL", "SETUSER", "default", f">{ROTATED}")
    for _ in range(2):
        said = login_round(ctx, "x", spec_redis)
        assert said is not None and "requires a password and the fleet sets none" in said, said
    assert clients_of(acl_redis, "default") == 1  # the kept one closed: only the admin's left
    assert ROTATED not in said and NO_PASSWORD_PROBE[1] not in said

    # no password needed again: accepted, one connection kept
    acl_redis.admin.execute_command("ACL", "SETUSER", "default", "nopass")
    assert [login_round(ctx, "x", spec_redis) for _ in range(2)] == ["", ""]
    assert clients_of(acl_redis, "default") == 2


def test_a_redis_older_than_6_without_a_password_answers_the_probe_with_its_ping(
    ctx: OperatorContext,
) -> None:
    old = Redis5("")  # no requirepass: every connection logged in
    try:
        spec_redis = {"url": f"redis://127.0.0.1:{old.port}/0"}
        dial_url = fleet_redis(ctx, NAMESPACE, spec_redis).dial_url
        ctx.sync_redis_clients[dial_url] = redis.Redis.from_url(dial_url, protocol=2, socket_timeout=5)
        # AUTH default <probe> is a wrong number of arguments there, and not retried with the probe
        # alone (that would ask a password-less Redis 5 for a password: "no password is set")
        assert [login_round(ctx, "x", spec_redis) for _ in range(2)] == ["", ""]
        assert old.auths == [2, 2]
    finally:
        old.close()


# ------------------------------------------------------------------ over TLS


@pytest.mark.skipif(
    shutil.which("openssl") is None,
    reason="needs the openssl command to make a certificate (.ci/run installs it)",
)
def test_a_rotated_password_is_refused_the_next_round_over_tls(
    acl_redis: AclRedis,  # noqa: F811
    ctx: OperatorContext,
    tmp_path: Path,
) -> None:
    from tests.test_tenancy_secrets import self_signed_certificate, tls_terminator

    cert, key = self_signed_certificate(tmp_path)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(tls_terminator(cert, key, acl_redis.port), loop).result(10)
    tls_port = server.sockets[0].getsockname()[1]
    acl_redis.user("fleet-a", *ALL_FLEET_KEYS)
    spec_redis = {
        "url": f"redis://fleet-a@127.0.0.1:{tls_port}/0",
        "passwordSecretRef": PASSWORD_REF,
        "tls": True,
    }
    chosen = fleet_redis(ctx, NAMESPACE, spec_redis)
    assert chosen.dial_url.startswith("rediss://")
    # the operator's client of that URL, as sync_redis makes it but trusting the test's certificate
    ctx.sync_redis_clients[chosen.dial_url] = redis.Redis.from_url(
        chosen.dial_url, ssl_ca_certs=cert, socket_timeout=5, socket_connect_timeout=5
    )
    try:
        assert [login_round(ctx, "x", spec_redis) for _ in range(2)] == ["", ""]
        assert clients_of(acl_redis, "fleet-a") == 1
        rotate(acl_redis, "fleet-a")
        said = login_round(ctx, "x", spec_redis)
        assert said is not None and said.startswith(REFUSED), said
        wait_for(lambda: clients_of(acl_redis, "fleet-a") == 0, 5, what="the refused connection closed")
    finally:
        server.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


# ------------------------------------------------------------------ a Redis older than 6


class Redis5:
    """Just enough of a Redis older than 6 (no ACL users) on loopback: AUTH takes the password only
    (``AUTH user password`` is a wrong number of arguments), PING needs it; ``password`` may change
    (CONFIG SET requirepass) while connections stay logged in. Counts the AUTHs it answers."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.auths: list[int] = []  # the number of arguments of each AUTH
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        logged_in = False
        with conn, conn.makefile("rb") as reader, contextlib.suppress(OSError, ValueError):
            while line := reader.readline():
                argv = [reader.readline()[:-2] for _ in range(int(line[1:]) * 2)][1::2]
                name = argv[0].upper()
                if name == b"AUTH":
                    self.auths.append(len(argv) - 1)
                    if len(argv) != 2:
                        reply = b"-ERR wrong number of arguments for 'auth' command\r\n"
                    elif argv[1].decode() == self.password:
                        logged_in, reply = True, b"+OK\r\n"
                    else:
                        reply = b"-ERR invalid password\r\n"
                elif not logged_in and self.password:
                    reply = b"-NOAUTH Authentication required.\r\n"
                elif name == b"PING":
                    reply = b"+PONG\r\n"
                else:
                    reply = b"-ERR unknown command\r\n"
                conn.sendall(reply)

    def close(self) -> None:
        self.listener.close()


def test_a_url_naming_a_user_logs_in_to_a_redis_older_than_6_with_the_password_alone(
    ctx: OperatorContext,
) -> None:
    old = Redis5(PASSWORD)
    try:
        spec_redis = {"url": f"redis://fleet@127.0.0.1:{old.port}/0", "passwordSecretRef": PASSWORD_REF}
        # the client as redis-py before 8 makes it (pyproject allows redis>=5): RESP2, so it logs in
        # with AUTH (8 sends HELLO 3 AUTH, which a Redis older than 6 does not know)
        dial_url = fleet_redis(ctx, NAMESPACE, spec_redis).dial_url
        ctx.sync_redis_clients[dial_url] = redis.Redis.from_url(dial_url, protocol=2, socket_timeout=5)
        # as redis-py does when it connects: refused with the user, then the password alone
        assert [login_round(ctx, "x", spec_redis) for _ in range(2)] == ["", ""]
        assert old.auths == [2, 1] + [2, 1] * 2  # the connection's own login, then each round's
        old.password = ROTATED
        said = login_round(ctx, "x", spec_redis)
        assert said is not None and said.startswith(REFUSED), said
    finally:
        old.close()
