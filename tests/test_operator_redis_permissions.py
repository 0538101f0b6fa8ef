"""A fleet whose Redis takes its credentials but denies the ACL user a command the fleet runs.

An ACL user may PING (so the fleet is not ``RedisAuthFailed``) and still be denied what the
operator's membership, the sidecars' load records or the gateways' pushes need: each of those calls
then fails on its own, only logged. Specification:

* the operator asks Redis, with the fleet's own credentials, which of the fleet's commands (on the
  fleet's keys and channels) the user may not run, without running any: nothing is written or
  published, even for a user allowed everything;
* a denial makes the fleet ``Degraded`` with reason ``RedisPermissionDenied``, a message naming each
  denied command, its key or channel, who needs it and the ACL user (never the password);
* one Warning Event says it when it starts or changes, not one per round;
* a user allowed everything, a Redis with no ACL and a Redis that does not answer are no problem;
* once the user is granted the command the condition goes away.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import redis
from fleet_fixtures import free_port

from prefixfleet.fleet.processes import redis_server_binary
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
    REDIS_AUTH_FAILED,
    REDIS_PERMISSION_DENIED,
    FleetRef,
    ObservedState,
    plan_reconcile,
)
from prefixfleet.operator.redis_permissions import fleet_commands
from prefixfleet.router.keys import FleetKeys
from tests.k8s.cluster import EmulatedCluster, emulator_fleet, operator_in_cluster, wait_for
from tests.test_operator_badinput_redis import Secrets
from tests.test_operator_redis_auth import PASSWORD_REF, password_secret

pytestmark = pytest.mark.slow

PASSWORD = "acl-Pw-51fd"
FLEET = "guarded"
NAMESPACE = "default"
REF = FleetRef(name=FLEET, namespace=NAMESPACE)
MEMBERS = f"pf:{NAMESPACE}.{FLEET}:members"


@dataclass(frozen=True)
class AclRedis:
    """A real Valkey/Redis on loopback whose ``default`` user administers the ACL users."""

    port: int
    admin: redis.Redis

    def user(self, name: str, *rules: str) -> str:
        """Create (or reset) ACL user ``name`` with PASSWORD and ``rules``; its URL."""
        self.admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{PASSWORD}", *rules)
        return f"redis://{name}:{PASSWORD}@127.0.0.1:{self.port}/0"


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    port = free_port()
    argv = [str(redis_server_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path)]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    admin = redis.Redis(host="127.0.0.1", port=port)

    def pings() -> bool:
        try:
            return bool(admin.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(pings, 15, what="the Redis-compatible server")
        yield AclRedis(port, admin)
    finally:
        admin.close()
        server.terminate()
        server.wait(10)


def permission_problem(url: str) -> str | None:
    """What one reconcile round finds out about the fleet's commands, dialling ``url``."""
    ctx = OperatorContext(kube=Secrets({}))  # type: ignore[arg-type]
    try:
        chosen = FleetRedis(url, dial_url=url)
        return probe_verdicts(chosen, redis_probe(ctx, chosen, REF))[0]
    finally:
        for client in ctx.sync_redis_clients.values():
            client.close()


ALL_FLEET_KEYS = ("~pf:*", "&pf:*", "+@all")


# ------------------------------------------------------------------ what the operator finds out


def test_a_user_allowed_everything_is_no_problem_and_nothing_is_written_or_published(
    acl_redis: AclRedis,
) -> None:
    listener = acl_redis.admin.pubsub()
    listener.psubscribe("*")
    try:
        assert listener.get_message(timeout=5)["type"] == "psubscribe"  # type: ignore[index]
        assert permission_problem(acl_redis.user("fleet", *ALL_FLEET_KEYS)) == ""
        # the probe queued HSET, SET, DEL, PUBLISH... and discarded them all
        assert acl_redis.admin.dbsize() == 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            message = listener.get_message(timeout=0.1)
            assert message is None, message
    finally:
        listener.close()


def test_the_minimal_user_docs_operator_md_gives_is_no_problem(acl_redis: AclRedis) -> None:
    fleet = f"pf:{NAMESPACE}.{FLEET}:*"
    commands = (
        "ping hgetall hset hdel del get mget set pexpire publish subscribe pubsub|numsub multi exec discard"
    )
    url = acl_redis.user("minimal", f"~{fleet}", f"&{fleet}", *(f"+{c}" for c in commands.split()))
    assert permission_problem(url) == ""


def test_the_default_user_of_a_redis_without_acl_rules_is_no_problem(acl_redis: AclRedis) -> None:
    assert permission_problem(f"redis://127.0.0.1:{acl_redis.port}/0") == ""


def test_a_denied_command_is_named_with_its_key_who_needs_it_and_the_user(acl_redis: AclRedis) -> None:
    problem = permission_problem(acl_redis.user("fleet-rw", *ALL_FLEET_KEYS, "-hset"))
    assert problem.startswith("the fleet's Redis accepted ACL user 'fleet-rw' but denies it"), problem
    assert f"HSET on key {MEMBERS} (the operator: membership)" in problem
    assert "HGETALL" not in problem and "PUBLISH" not in problem
    assert PASSWORD not in problem and "127.0.0.1" not in problem


def test_channels_the_user_may_not_use_name_each_command(acl_redis: AclRedis) -> None:
    problem = permission_problem(acl_redis.user("no-channels", "~pf:*", "resetchannels", "+@all"))
    prefix = f"pf:{NAMESPACE}.{FLEET}:"
    for said in (
        f"PUBLISH on channel {prefix}loads (the sidecars: load pushes)",
        f"PUBLISH on channel {prefix}events",
        f"PUBLISH on channel {prefix}sends (the gateways: send notices)",
        f"SUBSCRIBE on channels {prefix}loads, {prefix}sends",
    ):
        assert said in problem, problem
    assert "HSET" not in problem and "MGET" not in problem


def test_keys_of_another_fleet_only_deny_every_keyed_command(acl_redis: AclRedis) -> None:
    problem = permission_problem(acl_redis.user("other", "~pf:other:*", "&pf:*", "+@all"))
    named = {c.name for c in fleet_commands(FleetKeys(REF.redis_fleet), "r") if c.on.startswith("key")}
    assert named == {"HGETALL", "HSET", "HDEL", "DEL", "GET", "MGET", "SET", "PEXPIRE"}
    for command in named:
        assert f"; {command} on key" in problem or f": {command} on key" in problem, (command, problem)
    assert "PUBLISH" not in problem and "SUBSCRIBE" not in problem


def test_a_user_denied_transactions_is_told_and_nothing_runs_outside_one(acl_redis: AclRedis) -> None:
    problem = permission_problem(acl_redis.user("no-multi", *ALL_FLEET_KEYS, "-multi", "-exec"))
    assert problem.endswith(
        "denies it commands the fleet runs: MULTI (the operator: membership (a transaction))."
        " Grant them (ACL SETUSER; docs/operator.md)"
    ), problem
    assert acl_redis.admin.dbsize() == 0  # the queued HSET/SET did not run without the MULTI


def test_exec_alone_denied_is_found_outside_a_transaction(acl_redis: AclRedis) -> None:
    problem = permission_problem(acl_redis.user("no-exec", *ALL_FLEET_KEYS, "-exec"))
    assert "EXEC (the operator: membership (a transaction))" in problem and "MULTI" not in problem


def test_redis_not_answering_is_no_permission_problem() -> None:
    assert permission_problem(f"redis://u:{PASSWORD}@127.0.0.1:{free_port()}/0") is None  # an outage


# ------------------------------------------------------------------ the connection it asks on


def reconcile_rounds(ctx: OperatorContext, url: str, rounds: int) -> list[str]:
    """What ``rounds`` reconciles of one operator find out (the login PING, then the probe), in turn."""
    chosen = FleetRedis(url, dial_url=url)
    found = []
    for _ in range(rounds):
        assert redis_login_check(ctx, {}, chosen)[0] == ""
        found.append(probe_verdicts(chosen, redis_probe(ctx, chosen, REF))[0])
    return found


@pytest.fixture
def ctx() -> Iterator[OperatorContext]:
    """One operator's context, kept across the rounds of a test (its Redis clients closed after)."""
    context = OperatorContext(kube=Secrets({}))  # type: ignore[arg-type]
    yield context
    for client in context.sync_redis_clients.values():
        client.close()


def connections_received(acl: AclRedis) -> int:
    return int(acl.admin.info("stats")["total_connections_received"])


def in_transaction(acl: AclRedis, user: str) -> list[dict[str, Any]]:
    """The server's clients logged in as ``user`` that are inside MULTI (CLIENT LIST flag x)."""
    return [c for c in acl.admin.client_list() if c.get("user") == user and "x" in c.get("flags", "")]


@pytest.mark.parametrize(
    ("user", "rules", "said"),
    [
        ("fleet", ALL_FLEET_KEYS, ""),
        ("no-hset", (*ALL_FLEET_KEYS, "-hset"), f"HSET on key {MEMBERS}"),
        ("no-multi", (*ALL_FLEET_KEYS, "-multi"), "MULTI (the operator: membership (a transaction))"),
        ("no-exec", (*ALL_FLEET_KEYS, "-exec"), "EXEC (the operator: membership (a transaction))"),
    ],
)
def test_reconciles_ask_on_one_kept_connection_not_a_new_one_each(
    acl_redis: AclRedis, ctx: OperatorContext, user: str, rules: tuple[str, ...], said: str
) -> None:
    url = acl_redis.user(user, *rules)
    before = connections_received(acl_redis)
    found = reconcile_rounds(ctx, url, 6)
    # the first round dials once; the later ones reuse that connection (before: one per round)
    assert connections_received(acl_redis) - before == 1
    assert in_transaction(acl_redis, user) == []
    assert len(set(found)) == 1 and said in found[0], found
    assert acl_redis.admin.dbsize() == 0


def test_a_connection_left_inside_multi_is_closed_not_reused(
    acl_redis: AclRedis, ctx: OperatorContext
) -> None:
    # DISCARD denied: the probe's connection stays inside its transaction. Reused, the next round's
    # PING would be QUEUED and its MULTI refused as nested, and the HSET denial would go unsaid.
    url = acl_redis.user("no-discard", *ALL_FLEET_KEYS, "-discard", "-hset")
    found = reconcile_rounds(ctx, url, 3)
    wait_for(lambda: not in_transaction(acl_redis, "no-discard"), 5, what="no client left in MULTI")
    assert len(found) == 3 and all(f"HSET on key {MEMBERS}" in f for f in found), found


def test_a_probe_cut_short_drops_its_connection(
    acl_redis: AclRedis, ctx: OperatorContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = acl_redis.user("cut-short", *ALL_FLEET_KEYS, "-hset")
    read_response = redis.connection.Connection.read_response
    reads = 0

    def times_out_after_queued(self: redis.connection.Connection, *args: Any, **kwargs: Any) -> Any:
        # MULTI and PING read, then a timeout while the fleet's commands sit queued in the transaction
        nonlocal reads
        reads += 1
        if reads == 3:
            raise redis.TimeoutError("injected: timed out reading a queued command's answer")
        return read_response(self, *args, **kwargs)

    chosen = FleetRedis(url, dial_url=url)
    assert redis_login_check(ctx, {}, chosen)[0] == ""
    with monkeypatch.context() as patch:
        patch.setattr(redis.connection.Connection, "read_response", times_out_after_queued)
        assert redis_probe(ctx, chosen, REF) is None  # a timeout: an outage, not said
    assert reads == 3
    wait_for(lambda: not in_transaction(acl_redis, "cut-short"), 5, what="no client left in MULTI")
    # the next round asks on a clean connection and says the denial again
    assert all(f"HSET on key {MEMBERS}" in f for f in reconcile_rounds(ctx, url, 2))


class PoolOfRedisPy50(redis.ConnectionPool):
    """A pool whose ``get_connection`` takes its arguments as redis-py 5.0 to 5.2 does: the command
    name required (and ignored). pyproject allows redis>=5; 5.3 made it optional."""

    def get_connection(self, command_name: str, *keys: Any, **options: Any) -> Any:  # type: ignore[override]
        return super().get_connection()


def test_the_login_and_probe_take_a_connection_as_redis_py_before_5_3_gives_one(
    acl_redis: AclRedis, ctx: OperatorContext
) -> None:
    # before: get_connection() without a command name raised TypeError, outside the RedisError and
    # OSError a round handles, so every reconcile of every fleet with a Redis failed whole
    url = acl_redis.user("no-hset", *ALL_FLEET_KEYS, "-hset")
    ctx.sync_redis_clients[url] = redis.Redis(connection_pool=PoolOfRedisPy50.from_url(url, socket_timeout=5))
    before = connections_received(acl_redis)
    found = reconcile_rounds(ctx, url, 3)  # each: the login, then the probe
    assert all(f"HSET on key {MEMBERS}" in f for f in found), found
    assert connections_received(acl_redis) - before == 1  # still one kept connection


def clients_of(acl: AclRedis, user: str) -> int:
    return sum(c.get("user") == user for c in acl.admin.client_list())


def in_process_kube(cluster: EmulatedCluster) -> Kube:
    """The emulated API server with the CRD and the fleets' password Secret, for handlers called
    in-process (no kopf operator running)."""
    cluster.install_crd()
    cluster.apply(password_secret(PASSWORD))
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=config)
    return Kube(kubernetes.client.ApiClient(config))


def test_a_url_no_fleet_dials_any_more_has_its_connection_closed(tmp_path: Path, acl_redis: AclRedis) -> None:
    # reconcile rounds as the operator runs them (reconcile_in_cluster, in-process) on an emulated
    # API server: the fleet's user changes, then the fleet is deleted
    acl_redis.user("fleet-a", *ALL_FLEET_KEYS)
    acl_redis.user("fleet-b", *ALL_FLEET_KEYS)
    cluster = EmulatedCluster(tmp_path / "cluster")
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    try:
        ctx.kube = in_process_kube(cluster)

        def rounds(user: str) -> None:
            cluster.apply(fleet_manifest(f"redis://{user}@127.0.0.1:{acl_redis.port}/0"))
            for _ in range(3):
                assert reconcile_in_cluster(ctx, NAMESPACE, FLEET) is not None

        rounds("fleet-a")
        assert clients_of(acl_redis, "fleet-a") == 1  # kept between rounds
        rounds("fleet-b")  # new credentials: the old URL's connection goes (before: kept for good)
        wait_for(lambda: clients_of(acl_redis, "fleet-a") == 0, 5, what="fleet-a's connection closed")
        assert clients_of(acl_redis, "fleet-b") == 1
        # another fleet on the same URL keeps it open when this one leaves it
        ctx.dial_redis(f"{NAMESPACE}/other", f"redis://fleet-b:{PASSWORD}@127.0.0.1:{acl_redis.port}/0")
        cluster.kubectl("delete", "pcf", FLEET)
        assert reconcile_in_cluster(ctx, NAMESPACE, FLEET) is None
        assert clients_of(acl_redis, "fleet-b") == 1 and len(ctx.sync_redis_clients) == 1
        ctx.dial_redis(f"{NAMESPACE}/other", "")  # gone too: nobody dials it
        wait_for(lambda: clients_of(acl_redis, "fleet-b") == 0, 5, what="fleet-b's connection closed")
        assert ctx.sync_redis_clients == {} and ctx.redis_users == {}
    finally:
        for client in ctx.sync_redis_clients.values():
            client.close()
        cluster.close()


# ------------------------------------------------------------------ what the fleet says (planner)


def test_the_fleet_is_degraded_with_one_event_per_distinct_denial() -> None:
    spec = FleetSpec.model_validate({"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 0})
    problem = "the fleet's Redis accepted ACL user 'u' but denies it commands the fleet runs: HSET ..."
    plan = plan_reconcile(REF, spec, ObservedState(redis_url="redis://r/0", redis_permission_problem=problem))
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True",
        REDIS_PERMISSION_DENIED,
        problem,
    )
    assert [(e.reason, e.message) for e in plan.events if e.type == "Warning"] == [
        (REDIS_PERMISSION_DENIED, problem)
    ]
    said = plan.status["conditions"]
    again = plan_reconcile(
        REF, spec, ObservedState(redis_url="redis://r/0", redis_permission_problem=problem, conditions=said)
    )
    assert not [e for e in again.events if e.type == "Warning"]
    other = plan_reconcile(
        REF,
        spec,
        ObservedState(redis_url="redis://r/0", redis_permission_problem=problem + " x", conditions=said),
    )
    assert [e.reason for e in other.events if e.type == "Warning"] == [REDIS_PERMISSION_DENIED]


def test_refused_credentials_come_before_denied_commands() -> None:
    spec = FleetSpec.model_validate({"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 0})
    observed = ObservedState(
        redis_url="redis://r/0", redis_auth_problem="refused", redis_permission_problem="denied"
    )
    degraded = next(
        c for c in plan_reconcile(REF, spec, observed).status["conditions"] if c["type"] == "Degraded"
    )
    assert degraded["reason"] == REDIS_AUTH_FAILED


# ------------------------------------------------------------------ the operator, end to end


def fleet_manifest(redis_url: str, name: str = FLEET) -> str:
    # the user in the URL, its password from a Secret (never in the spec)
    return emulator_fleet(name, NAMESPACE, {"url": redis_url, "passwordSecretRef": PASSWORD_REF})


def test_the_operator_says_which_command_redis_denies_and_recovers_once_granted(
    tmp_path: Path, acl_redis: AclRedis
) -> None:
    acl_redis.user("fleet-user", *ALL_FLEET_KEYS, "-hset")
    with operator_in_cluster(tmp_path, "", kubelet=False) as (cluster, operator):
        cluster.apply(password_secret(PASSWORD))
        cluster.apply(fleet_manifest(f"redis://fleet-user@127.0.0.1:{acl_redis.port}/0"))

        def degraded() -> dict[str, Any] | None:
            status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
            return next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)

        def events() -> list[dict[str, Any]]:
            selector = f"reason={REDIS_PERMISSION_DENIED}"
            return cluster.kubectl_json("get", "events", "--field-selector", selector)["items"]

        def timer_rounds() -> int:
            return operator.log_path.read_text(errors="replace").count("Timer 'fleet_timer' succeeded")

        cond = wait_for(
            lambda: (c := degraded()) and c["reason"] == REDIS_PERMISSION_DENIED and c,
            40,
            what="RedisPermissionDenied",
        )
        assert cond["status"] == "True"
        assert "ACL user 'fleet-user'" in cond["message"] and f"HSET on key {MEMBERS}" in cond["message"]
        rounds = timer_rounds()
        wait_for(lambda: timer_rounds() >= rounds + 2, 40, what="two more reconcile rounds")
        said = wait_for(events, 20, what="the RedisPermissionDenied Event")
        assert len(said) == 1 and said[0]["type"] == "Warning", [e["message"] for e in said]
        assert said[0]["involvedObject"]["name"] == FLEET and said[0]["message"] == cond["message"]
        assert PASSWORD not in json.dumps([cluster.kubectl_json("get", "pcf", FLEET)["status"], said])

        # granted: the next round finds nothing denied and the condition goes away
        acl_redis.admin.execute_command("ACL", "SETUSER", "fleet-user", "+hset")
        wait_for(
            lambda: (c := degraded()) is not None and c["reason"] != REDIS_PERMISSION_DENIED,
            40,
            what="the fleet to stop showing RedisPermissionDenied",
        )
        assert len(events()) == 1
        log = operator.log_path.read_text(errors="replace")
        assert "Traceback" not in log, operator.log_tail(60)
        assert PASSWORD not in log
