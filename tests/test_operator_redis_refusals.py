"""What the operator's Redis checks say when Redis answers with an error that is not about access.

The login check (AUTH + PING) and the permission probe (the fleet's commands queued in a transaction
that is then aborted) used to know two kinds of answer: a refusal of the credentials or the ACL
(RedisAuthFailed, RedisPermissionDenied), and no answer (an outage: nothing said). A Redis that
answers, but refuses the fleet's commands for another reason, fell between: a read-only replica or a
full Redis refused the fleet's writes while the probe said nothing; a dataset loading, a script
running or a failed snapshot refused the PING and the round looked like an outage. Specification:

* an error about neither the credentials nor the ACL is never called a denial, nor crashes a round:
  the fleet is ``Degraded`` with reason ``RedisCommandsRefused``, a message naming each refused
  command (its key or channel, who runs it) with Redis's own error, one Warning Event when it starts
  or changes;
* a PING refused that way decides nothing about the credentials (the last verdict stands);
* a connection closed mid-check is an outage (nothing said), as before;
* a Redis older than 6 (no ACL, no ``ACL`` command) has nothing to deny: a password-only login with
  every command allowed; the checks say nothing and run nothing;
* the probe ends the transaction holding the fleet's commands with DISCARD, never EXEC; a user
  denied DISCARD has that connection closed (one new connection per round). 2870a24 ended it with
  EXEC after a command refused on purpose, which a proxy answering that command itself turned into
  running the fleet's writes (tests/test_operator_redis_probe_proxy.py).

Real Valkey/Redis servers where they can produce the answer (READONLY, OOM, MISCONF, BUSY, an ACL);
a small fake RESP server in this file for what a real one cannot easily be made to answer on demand
(LOADING lasts only while a large dataset loads; a Redis 5 without ACLs; Redis 6.0's refused EXEC
answered NOPERM; a proxy refusing MULTI; a connection closed mid-check).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import redis
from fleet_fixtures import free_port, wait_until

from prefixfleet.operator.handlers import (
    FleetRedis,
    OperatorContext,
    probe_verdicts,
    reconcile_in_cluster,
    redis_login_check,
    redis_probe,
)
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import (
    REDIS_COMMANDS_REFUSED,
    REDIS_PERMISSION_DENIED,
    FleetRef,
    ObservedState,
    plan_reconcile,
)
from tests import test_operator_redis_permissions as permissions_tests
from tests.k8s.cluster import EmulatedCluster, emulator_fleet
from tests.test_operator_redis_permissions import (
    ALL_FLEET_KEYS,
    PASSWORD,
    AclRedis,
    connections_received,
    in_transaction,
)

FLEET = "refused"
NAMESPACE = "default"
REF = FleetRef(name=FLEET, namespace=NAMESPACE)
PREFIX = f"pf:{NAMESPACE}.{FLEET}:"
WRITES = ("HSET", "HDEL", "DEL", "SET", "PEXPIRE")  # the fleet's commands a read-only replica refuses
# the fixtures of the ACL tests: a real Valkey/Redis whose default user administers ACL users (its
# directory is the test's tmp_path), and one operator's context kept across a test's rounds
acl_redis = permissions_tests.acl_redis
ctx = permissions_tests.ctx


# ------------------------------------------------------------------ real servers


def default_url(server: AclRedis) -> str:
    """The URL of the server's default user (no password)."""
    return f"redis://127.0.0.1:{server.port}/0"


def rounds(ctx: OperatorContext, url: str, n: int = 1) -> list[tuple[str | None, str | None, str]]:
    """What ``n`` reconcile rounds find out, as the operator asks: (the login check's answer, the
    permission check's, what Redis refused for another reason), the permission check only asked when
    the login was accepted."""
    chosen = FleetRedis(url, dial_url=url)
    found = []
    for _ in range(n):
        login, refused = redis_login_check(ctx, {}, chosen)
        permissions: str | None = None
        if login == "":
            permissions, refused = probe_verdicts(chosen, redis_probe(ctx, chosen, REF))
        found.append((login, permissions, refused))
    return found


# ------------------------------------------------------------------ DISCARD, never EXEC


@pytest.mark.parametrize(
    ("user", "rules", "said"),
    [
        ("no-discard", ("-discard", "-hset"), f"HSET on key {PREFIX}members (the operator: membership)"),
        ("no-discard-exec", ("-discard", "-exec"), "EXEC (the operator: membership (a transaction))"),
    ],
)
def test_a_user_denied_discard_has_the_probes_connection_closed_never_an_exec(
    acl_redis: AclRedis, ctx: OperatorContext, user: str, rules: tuple[str, ...], said: str
) -> None:
    # the transaction holding the fleet's commands is never ended by EXEC (a proxy answering a
    # command itself would have it run: tests/test_operator_redis_probe_proxy.py); DISCARD refused,
    # the connection is closed, which ends it on the server without running anything. The cost: one
    # new connection per round (2870a24 kept one by ending the transaction with EXEC)
    url = acl_redis.user(user, *ALL_FLEET_KEYS, *rules)
    before = connections_received(acl_redis)
    found = rounds(ctx, url, 3)
    assert connections_received(acl_redis) - before == 3
    wait_until(lambda: in_transaction(acl_redis, user) == [], 10, what="no connection left inside MULTI")
    assert len(set(found)) == 1, found
    login, permissions, refused = found[0]
    assert login == "" and refused == "", found[0]
    assert permissions is not None and said in permissions, permissions
    assert "DISCARD" not in permissions  # the fleet never runs it: not a denial
    assert acl_redis.admin.dbsize() == 0  # the probe's writes never ran


def test_the_minimal_user_keeps_one_connection(acl_redis: AclRedis, ctx: OperatorContext) -> None:
    # +discard (docs/operator.md): the fleet never runs it, but the check ends its transaction with it
    fleet = f"{PREFIX}*"
    commands = (
        "ping hgetall hset hdel del get mget set pexpire publish subscribe pubsub|numsub multi exec discard"
    )
    url = acl_redis.user("minimal", f"~{fleet}", f"&{fleet}", *(f"+{c}" for c in commands.split()))
    before = connections_received(acl_redis)
    assert rounds(ctx, url, 3) == [("", "", "")] * 3
    assert connections_received(acl_redis) - before == 1


# ------------------------------------------------------------------ errors a real server answers


def test_a_read_only_replica_refuses_the_fleets_writes_and_says_so(
    acl_redis: AclRedis, ctx: OperatorContext
) -> None:
    # a replica of a primary that is not there: still read-only (replica-read-only yes, the default)
    acl_redis.admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    [(login, permissions, refused)] = rounds(ctx, default_url(acl_redis))
    assert (login, permissions) == ("", "")  # nothing about access: not a denial
    assert refused.startswith(
        "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL:"
    )
    assert refused.endswith("READONLY You can't write against a read only replica."), refused
    for command in WRITES:
        assert f"{command} on key" in refused, (command, refused)
    assert f"HSET on key {PREFIX}members (the operator: membership)" in refused
    for reads in ("HGETALL", "MGET", "GET on", "PUBLISH", "SUBSCRIBE"):
        assert reads not in refused, (reads, refused)
    # the ACL is still asked: a denial on a replica is said as a denial
    url = acl_redis.user("replica-user", *ALL_FLEET_KEYS, "-hgetall")
    [(_, permissions, refused)] = rounds(ctx, url)
    assert permissions is not None and "HGETALL on key" in permissions and "READONLY" not in permissions
    assert "READONLY" in refused


def test_a_full_redis_names_the_writes_it_refuses(acl_redis: AclRedis, ctx: OperatorContext) -> None:
    # noeviction (the default): every write that may grow is refused
    acl_redis.admin.config_set("maxmemory", "1")
    try:
        [(login, permissions, refused)] = rounds(ctx, default_url(acl_redis))
    finally:
        acl_redis.admin.config_set("maxmemory", "0")
    assert (login, permissions) == ("", "")
    assert "OOM command not allowed when used memory > 'maxmemory'" in refused, refused
    assert f"SET on key {PREFIX}load:" in refused and f"HSET on key {PREFIX}members" in refused
    # once it has room again the next round says nothing
    assert rounds(ctx, default_url(acl_redis)) == [("", "", "")]


def test_writes_stopped_after_a_failed_snapshot_refuse_the_ping(
    tmp_path: Path, acl_redis: AclRedis, ctx: OperatorContext
) -> None:
    # stop-writes-on-bgsave-error (the default): once a snapshot fails while snapshots are configured,
    # Redis refuses writes and PING (MISCONF). It fails because its file's name (in the server's
    # directory, tmp_path) is taken by a directory.
    admin = acl_redis.admin
    admin.config_set("save", "3600 1")
    (tmp_path / "dump.rdb").mkdir()
    admin.bgsave()
    wait_until(
        lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err", 20, what="the snapshot to fail"
    )
    [(login, permissions, refused)] = rounds(ctx, default_url(acl_redis))
    assert login is None and permissions is None  # not asked: nothing decided about access
    assert refused.startswith(
        "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: PING"
        " (the operator, the sidecars and the gateways): MISCONF "
    ), refused
    # the connection is kept: a failing snapshot does not make every round dial again
    before = connections_received(acl_redis)
    assert rounds(ctx, default_url(acl_redis), 3) == [(login, permissions, refused)] * 3
    assert connections_received(acl_redis) == before
    admin.config_set("save", "")  # no snapshot to fail: writes accepted again
    assert rounds(ctx, default_url(acl_redis)) == [("", "", "")]


def test_a_busy_script_refuses_the_ping_and_is_named(acl_redis: AclRedis, ctx: OperatorContext) -> None:
    acl_redis.admin.config_set("busy-reply-threshold", "10")  # ms; Redis < 7 names it lua-time-limit
    # a script that never ends, sent without waiting for its answer (it only comes once killed)
    looping = socket.create_connection(("127.0.0.1", acl_redis.port), timeout=10)
    try:
        script = "while true do end"
        looping.sendall(f"*3\r\n$4\r\nEVAL\r\n${len(script)}\r\n{script}\r\n$1\r\n0\r\n".encode())

        def busy() -> bool:
            with socket.create_connection(("127.0.0.1", acl_redis.port), timeout=10) as probe:
                probe.sendall(b"*1\r\n$4\r\nPING\r\n")
                return probe.recv(100).startswith(b"-BUSY")

        wait_until(busy, 20, what="the server to answer BUSY")
        [(login, permissions, refused)] = rounds(ctx, default_url(acl_redis))
    finally:
        with socket.create_connection(("127.0.0.1", acl_redis.port), timeout=10) as killer:
            killer.sendall(b"*2\r\n$6\r\nSCRIPT\r\n$4\r\nKILL\r\n")
            killer.recv(100)
        looping.recv(200)  # the script's own answer: once it came, the script has ended
        looping.close()
    assert login is None and permissions is None
    assert "PING (the operator, the sidecars and the gateways): BUSY " in refused, refused
    assert rounds(ctx, default_url(acl_redis)) == [("", "", "")]  # the script killed: nothing to say


# ------------------------------------------------------------------ errors from a fake server


@dataclass
class Session:
    """One client connection's state on the fake server."""

    password_ok: bool
    multi: bool = False
    dirty: bool = False
    queued: list[list[str]] = field(default_factory=list)


# Redis's arity of the commands the fake knows (negative: at least that many words)
ARITY = {
    "HELLO": -1, "AUTH": -2, "PING": -1, "MULTI": 1, "EXEC": 1, "DISCARD": 1, "CLIENT": -2, "SELECT": 2,
    "GET": 2, "SET": -3, "MGET": -2, "DEL": -2, "HSET": -4, "HDEL": -3, "HGETALL": 2,
    "PEXPIRE": 3, "PUBLISH": 3, "SUBSCRIBE": -2, "PUBSUB": -2,
}  # fmt: skip


class FakeRedis:
    """A Redis speaking RESP on a loopback port the kernel picks (bound at once, so no race), with
    Redis's rules for MULTI/EXEC/DISCARD (a command refused while queueing makes EXEC abort) and no
    ACL (``ACL`` is an unknown command). ``version`` 5: AUTH takes a password alone (two words are a
    wrong number of arguments) and HELLO is unknown; 6: HELLO (RESP3) and AUTH with a user, any user.
    ``refuse`` answers a command (by name) with a raw error before anything else, as Redis rejects
    one (and, inside MULTI, marks the transaction); ``close_on`` closes the connection when that
    command arrives. ``ran`` records every command it ran outside a transaction or in an EXEC,
    beyond the connection's own (HELLO, AUTH, CLIENT, SELECT, PING)."""

    def __init__(
        self, version: int = 6, password: str = "", refuse: dict[str, str] | None = None, close_on: str = ""
    ) -> None:
        self.version = version
        self.password = password
        self.refuse = refuse or {}
        self.close_on = close_on
        self.connections = 0
        self.ran: list[list[str]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def url(self, userinfo: str = "") -> str:
        return f"redis://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.server.close()

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            serving = threading.Thread(target=self.serve, args=(conn,), daemon=True)
            serving.start()

    def serve(self, conn: socket.socket) -> None:
        session = Session(password_ok=not self.password)
        with conn, conn.makefile("rb") as reader:
            while (argv := read_command(reader)) is not None:
                reply = self.answer(session, argv)
                if reply is None:
                    return  # closes the connection mid-conversation
                conn.sendall(reply.encode())

    def answer(self, s: Session, argv: list[str]) -> str | None:
        name = argv[0].upper()
        if name == self.close_on:
            return None

        def reject(error: str) -> str:
            s.dirty = s.dirty or s.multi
            return f"-{error}\r\n"

        if name in self.refuse:
            return reject(self.refuse[name])
        if name not in ARITY or (name == "HELLO" and self.version < 6):
            # as Redis 5 words it, quoting the first arguments
            quoted = "".join(f"`{a}`, " for a in argv[1:])
            return reject(f"ERR unknown command `{argv[0]}`, with args beginning with: {quoted}")
        arity = ARITY[name]
        if (arity > 0 and len(argv) != arity) or len(argv) < -arity:
            return reject(f"ERR wrong number of arguments for '{argv[0].lower()}' command")
        if name == "HELLO":
            if "AUTH" in argv:
                s.password_ok = not self.password or argv[argv.index("AUTH") + 2] == self.password
                if not s.password_ok:
                    return reject("WRONGPASS invalid username-password pair or user is disabled.")
            return "%1\r\n$5\r\nproto\r\n:3\r\n"
        if name == "AUTH":
            if len(argv) == 3 and self.version >= 6:
                s.password_ok = not self.password or argv[2] == self.password
                return "+OK\r\n" if s.password_ok else reject("WRONGPASS invalid username-password pair")
            if len(argv) != 2:
                return reject("ERR wrong number of arguments for 'auth' command")
            if not self.password:
                return reject("ERR Client sent AUTH, but no password is set")
            s.password_ok = argv[1] == self.password
            return "+OK\r\n" if s.password_ok else reject("ERR invalid password")
        if not s.password_ok:
            return reject("NOAUTH Authentication required.")
        if name == "MULTI":
            if s.multi:
                return reject("ERR MULTI calls can not be nested")
            s.multi, s.dirty, s.queued = True, False, []
            return "+OK\r\n"
        if name in ("EXEC", "DISCARD"):
            if not s.multi:
                return reject(f"ERR {name} without MULTI")
            queued, dirty = s.queued, s.dirty
            s.multi, s.dirty, s.queued = False, False, []
            if name == "DISCARD":
                return "+OK\r\n"
            if dirty:
                return "-EXECABORT Transaction discarded because of previous errors.\r\n"
            self.ran += queued
            return f"*{len(queued)}\r\n" + "+OK\r\n" * len(queued)
        if s.multi:
            s.queued.append(argv)
            return "+QUEUED\r\n"
        if name == "PING":
            return "+PONG\r\n"
        if name in ("CLIENT", "SELECT"):
            return "-ERR Unknown subcommand\r\n" if name == "CLIENT" else "+OK\r\n"
        self.ran.append(argv)
        return "+OK\r\n"


def read_command(reader: Any) -> list[str] | None:
    """One RESP array of bulk strings (a client's command); None when the client is gone."""
    header = reader.readline()
    if not header.startswith(b"*"):
        return None
    argv = []
    for _ in range(int(header[1:])):
        size = int(reader.readline()[1:])
        argv.append(reader.read(size + 2)[:-2].decode())
    return argv


@contextlib.contextmanager
def fake_redis(**kwargs: Any) -> Iterator[FakeRedis]:
    fake = FakeRedis(**kwargs)
    try:
        yield fake
    finally:
        fake.close()


def test_a_dataset_loading_is_named_not_called_an_outage_or_a_denial(ctx: OperatorContext) -> None:
    # a real Redis answers LOADING only while it loads a large dataset at start: a fake one, always
    with fake_redis(refuse={"PING": "LOADING Redis is loading the dataset in memory"}) as fake:
        [(login, permissions, refused)] = rounds(ctx, fake.url())
    assert login is None and permissions is None  # nothing decided about the credentials
    assert refused == (
        "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: PING"
        " (the operator, the sidecars and the gateways): LOADING Redis is loading the dataset in memory"
    )


@pytest.mark.parametrize("userinfo", ["fleet:" + PASSWORD, ":" + PASSWORD, ""])
def test_a_redis_older_than_6_is_named_when_the_client_speaks_resp3(
    ctx: OperatorContext, userinfo: str
) -> None:
    # redis-py 8 opens every connection with HELLO 3, which Redis 5 does not know: no client of the
    # fleet can connect. Before, the round looked like an outage (nothing said). Older redis-py
    # (RESP2 by default; pyproject allows redis>=5) connects, and the Redis has nothing to deny.
    resp3 = getattr(redis.utils, "DEFAULT_RESP_VERSION", 2) == 3
    with fake_redis(version=5, password=PASSWORD if userinfo else "") as fake:
        found = rounds(ctx, fake.url(userinfo), 2)
        assert fake.ran == []
    if not resp3:
        assert found == [("", "", "")] * 2
        return
    assert (
        found
        == [
            (
                None,  # nothing decided about the credentials
                None,
                "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: HELLO"
                " (every Redis client of the fleet, as it connects: Redis 6 or later):"
                " ERR unknown command (a Redis older than 6)",
            )
        ]
        * 2
    )
    # Redis 5 quotes the HELLO's arguments, the password among them: never repeated
    assert PASSWORD not in repr(found)


@pytest.mark.parametrize("userinfo", ["fleet:" + PASSWORD, ":" + PASSWORD])
def test_a_redis_older_than_6_has_no_acl_so_nothing_is_denied_or_run(
    ctx: OperatorContext, userinfo: str
) -> None:
    # Redis 5 spoken to in RESP2 (?protocol=2): no users, no ACL command. A password-only login,
    # every command allowed: the checks say nothing and run nothing, on one kept connection
    with fake_redis(version=5, password=PASSWORD) as fake:
        assert rounds(ctx, fake.url(userinfo) + "?protocol=2", 3) == [("", "", "")] * 3
        assert fake.ran == [] and fake.connections == 1


def test_a_redis_older_than_6_that_wants_a_password_the_fleet_lacks_says_so(ctx: OperatorContext) -> None:
    with fake_redis(version=5, password=PASSWORD) as fake:
        [(login, permissions, refused)] = rounds(ctx, fake.url() + "?protocol=2")
    assert login is not None and "requires a password and the fleet sets none" in login
    assert (permissions, refused) == (None, "")


def test_redis_6_0_answering_a_refused_exec_with_noperm_alone_is_a_denial(ctx: OperatorContext) -> None:
    # Redis 6.0 answers a refused EXEC with NOPERM alone (6.2 and later: EXECABORT quoting it); the
    # probe asks EXEC outside any transaction, so none is left open either way
    nope = "NOPERM this user has no permissions to run the 'exec' command or its subcommand"
    with fake_redis(refuse={"EXEC": nope}) as fake:
        found = rounds(ctx, fake.url(), 3)
        assert fake.ran == [] and fake.connections == 1
    assert len(set(found)) == 1 and found[0][2] == "", found
    assert found[0][1] is not None and found[0][1].endswith(
        "denies it commands the fleet runs: EXEC (the operator: membership (a transaction))."
        " Grant them (ACL SETUSER; docs/operator.md)"
    )


def test_a_proxy_that_refuses_multi_is_named(ctx: OperatorContext) -> None:
    # before: nothing was said, and the connection was closed each round
    with fake_redis(refuse={"MULTI": "ERR unsupported command 'multi'"}) as fake:
        found = rounds(ctx, fake.url(), 3)
        assert fake.ran == [] and fake.connections == 1
    assert (
        found
        == [
            (
                "",
                "",
                "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: MULTI"
                " (the operator: membership (a transaction)): ERR unsupported command 'multi'",
            )
        ]
        * 3
    )


def test_a_command_the_server_does_not_know_is_named(ctx: OperatorContext) -> None:
    with fake_redis(
        refuse={"PUBSUB": "ERR unknown command `PUBSUB`, with args beginning with: `NUMSUB`"}
    ) as fake:
        [(_, permissions, refused)] = rounds(ctx, fake.url())
        assert fake.ran == []
    assert permissions == ""
    assert refused.endswith(
        f"PUBSUB NUMSUB on channel {PREFIX}sends (the gateways: send notices):"
        " ERR unknown command `PUBSUB`, with args beginning with: `NUMSUB`"
    ), refused


@pytest.mark.parametrize("command", ["PING", "MULTI", "HSET", "EXEC"])
def test_a_connection_closed_mid_check_is_an_outage(ctx: OperatorContext, command: str) -> None:
    with fake_redis(close_on=command) as fake:
        [(login, permissions, refused)] = rounds(ctx, fake.url())
        assert fake.ran == []
    assert refused == ""  # nothing named: an outage keeps the last verdict
    assert (login, permissions) == ((None, None) if command == "PING" else ("", None))


# ------------------------------------------------------------------ what the fleet says


SPEC = FleetSpec.model_validate({"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 0})


def degraded(plan_status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in plan_status["conditions"] if c["type"] == "Degraded")


def test_the_fleet_is_degraded_with_one_event_per_distinct_refusal() -> None:
    refused = "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: ..."
    plan = plan_reconcile(REF, SPEC, ObservedState(redis_url="redis://r/0", redis_refused=refused))
    cond = degraded(plan.status)
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", REDIS_COMMANDS_REFUSED, refused)
    assert [(e.reason, e.message) for e in plan.events if e.type == "Warning"] == [
        (REDIS_COMMANDS_REFUSED, refused)
    ]
    assert not [c for c in plan.status["conditions"] if c["type"] == "RedisAccessDenied"]  # not a denial
    said = plan.status["conditions"]
    again = plan_reconcile(
        REF, SPEC, ObservedState(redis_url="redis://r/0", redis_refused=refused, conditions=said)
    )
    assert not [e for e in again.events if e.type == "Warning"]
    # a denial comes first, and the refusal then posts no Event each round (it is not Degraded's)
    both = ObservedState(redis_url="redis://r/0", redis_permission_problem="denied", redis_refused=refused)
    first = plan_reconcile(REF, SPEC, both)
    assert degraded(first.status)["reason"] == REDIS_PERMISSION_DENIED
    both = ObservedState(
        redis_url="redis://r/0", redis_permission_problem="denied", redis_refused=refused,
        conditions=first.status["conditions"],
    )  # fmt: skip
    assert not [e for e in plan_reconcile(REF, SPEC, both).events if e.type == "Warning"]


def test_a_reconcile_on_a_read_only_replica_says_redis_commands_refused(
    tmp_path: Path, acl_redis: AclRedis
) -> None:
    # the round as the operator runs it (reconcile_in_cluster, in-process) on an emulated API server
    acl_redis.admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    cluster = EmulatedCluster(tmp_path / "cluster")
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    try:
        cluster.install_crd()
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=config)
        ctx.kube = Kube(kubernetes.client.ApiClient(config))
        cluster.apply(emulator_fleet(FLEET, NAMESPACE, {"url": default_url(acl_redis)}, replicas=0))
        outcome = reconcile_in_cluster(ctx, NAMESPACE, FLEET)
        assert outcome is not None
        status = cluster.kubectl_json("get", "pcf", FLEET)["status"]
        cond = degraded(status)
        assert cond["reason"] == REDIS_COMMANDS_REFUSED, cond
        assert f"HSET on key {PREFIX}members" in cond["message"] and "READONLY" in cond["message"]
        assert [e.reason for e in outcome.events if e.type == "Warning"] == [REDIS_COMMANDS_REFUSED]
        assert not [c for c in status["conditions"] if c["type"] == "RedisAccessDenied"]
        # the primary again: the next round clears it
        acl_redis.admin.execute_command("REPLICAOF", "NO", "ONE")
        reconcile_in_cluster(ctx, NAMESPACE, FLEET)
        cond = degraded(cluster.kubectl_json("get", "pcf", FLEET)["status"])
        assert cond["reason"] != REDIS_COMMANDS_REFUSED, cond
    finally:
        for client in ctx.sync_redis_clients.values():
            client.close()
        cluster.close()
