"""A fleet whose Redis refuses its credentials: said on the fleet, not only in the operator's log.

The Secrets may all be readable and the URL well formed, yet Redis (``requirepass`` or an ACL user)
refuses the password the fleet gives it: every sidecar and gateway of the fleet then fails to
register or read, and the gateways route blind. Specification:

* the operator's own connection for the fleet is refused (wrong password, unknown or disabled user,
  no password sent): the fleet is ``Degraded`` with reason ``RedisAuthFailed`` and a message naming
  the field and Secret holding the refused credentials — never the password, the URL or the
  server's reply;
* one Warning Event ``RedisAuthFailed`` says it when it starts or changes, not one per round;
* Redis not answering (refused, timed out) is an outage, not an auth problem: nothing new is said;
* once the Secret holds the right password the condition goes away; the operator logs no traceback.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fleet_fixtures import free_port
from redis.exceptions import NoPermissionError, ResponseError

from prefixfleet.fleet.processes import redis_server_binary
from prefixfleet.operator.handlers import OperatorContext, auth_refusal, fleet_redis, redis_login_check
from prefixfleet.operator.planner import REDIS_AUTH_FAILED
from tests.k8s.cluster import emulator_fleet, operator_in_cluster, wait_for
from tests.test_operator_badinput_redis import Secrets

pytestmark = pytest.mark.slow

PASSWORD = "right-Pw-7c1e"
WRONG = "wrong-Pw-93ab"
FLEET = "guarded"
NAMESPACE = "default"
PASSWORD_REF = {"name": "fleet-redis-password", "key": "password"}
URL_REF = {"name": "fleet-redis", "key": "url"}


@pytest.fixture
def guarded_redis(tmp_path: Path) -> Iterator[str]:
    """A real Valkey/Redis on loopback that requires PASSWORD; its URL carries none."""
    port = free_port()
    argv = [str(redis_server_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", PASSWORD]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(pings, 15, what="the password-protected Redis-compatible server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def auth_problem(secrets: dict[str, Any], spec_redis: dict[str, Any]) -> str:
    """What one reconcile round finds out by dialling the fleet's Redis with these Secrets."""
    ctx = OperatorContext(kube=Secrets(secrets))  # type: ignore[arg-type]
    try:
        chosen = fleet_redis(ctx, NAMESPACE, spec_redis)
        assert chosen.problem == "" and chosen.dial_url
        return redis_login_check(ctx, spec_redis, chosen)[0] or ""
    finally:
        for client in ctx.sync_redis_clients.values():
            client.close()


# ------------------------------------------------------------------ what the operator finds out


def test_the_right_password_is_no_problem(guarded_redis: str) -> None:
    spec_redis = {"url": guarded_redis, "passwordSecretRef": PASSWORD_REF}
    assert auth_problem({"fleet-redis-password": {"password": PASSWORD}}, spec_redis) == ""


def test_a_wrong_password_names_its_secret_and_not_the_password(guarded_redis: str) -> None:
    spec_redis = {"url": guarded_redis, "passwordSecretRef": PASSWORD_REF}
    problem = auth_problem({"fleet-redis-password": {"password": WRONG}}, spec_redis)
    assert problem.startswith(
        "spec.redis.passwordSecretRef: the password in Secret 'fleet-redis-password' key 'password':"
    ), problem
    assert "refused" in problem and WRONG not in problem and guarded_redis not in problem


def test_a_wrong_password_in_the_secrets_url_names_that_secret(guarded_redis: str) -> None:
    url = guarded_redis.replace("redis://", f"redis://alice:{WRONG}@")
    problem = auth_problem({"fleet-redis": {"url": url}}, {"secretRef": URL_REF})
    assert problem.startswith("spec.redis.secretRef: the URL in Secret 'fleet-redis' key 'url':"), problem
    assert WRONG not in problem and "alice" not in problem and "127.0.0.1" not in problem


def test_no_password_at_all_says_which_field_would_give_one(guarded_redis: str) -> None:
    problem = auth_problem({}, {"url": guarded_redis})
    assert problem.startswith("spec.redis.passwordSecretRef: ") and "requires a password" in problem


def test_redis_not_answering_is_an_outage_not_an_auth_problem() -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: connection refused
    assert auth_problem({"fleet-redis-password": {"password": WRONG}}, {"url": closed}) == ""


def test_only_errors_about_the_credentials_count() -> None:
    chosen = fleet_redis(OperatorContext(kube=Secrets({})), NAMESPACE, {"url": "redis://r:6379/0"})  # type: ignore[arg-type]
    spec_redis = {"url": "redis://r:6379/0"}
    assert auth_refusal(spec_redis, chosen, ResponseError("WRONGTYPE Operation against a key")) == ""
    assert auth_refusal(spec_redis, chosen, redis.TimeoutError("Timeout reading from socket")) == ""
    assert auth_refusal(spec_redis, chosen, ConnectionRefusedError(111, "refused")) == ""
    assert "requires a password" in auth_refusal(spec_redis, chosen, ResponseError("NOAUTH Authentication"))
    assert "may not run PING" in auth_refusal(
        {**spec_redis, "passwordSecretRef": PASSWORD_REF}, chosen, NoPermissionError("this user has no perm")
    )


# ------------------------------------------------------------------ the operator, end to end


def password_secret(password: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": PASSWORD_REF["name"], "namespace": NAMESPACE},
            "data": {"password": base64.b64encode(password.encode()).decode()},
        }
    )


def fleet_manifest(redis_url: str) -> str:
    # the user in the URL, its password from a Secret (never in the spec)
    return emulator_fleet(FLEET, NAMESPACE, {"url": redis_url, "passwordSecretRef": PASSWORD_REF})


def test_the_operator_says_redis_refused_the_password_and_recovers_once_fixed(
    tmp_path: Path, guarded_redis: str
) -> None:
    with operator_in_cluster(tmp_path, "", kubelet=False) as (cluster, operator):
        cluster.apply(password_secret(WRONG))
        cluster.apply(fleet_manifest(guarded_redis))

        def degraded() -> dict[str, Any] | None:
            status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
            return next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)

        def events() -> list[dict[str, Any]]:
            selector = f"reason={REDIS_AUTH_FAILED}"
            return cluster.kubectl_json("get", "events", "--field-selector", selector)["items"]

        def timer_rounds() -> int:
            return operator.log_path.read_text(errors="replace").count("Timer 'fleet_timer' succeeded")

        cond = wait_for(
            lambda: (c := degraded()) and c["reason"] == REDIS_AUTH_FAILED and c, 40, what="RedisAuthFailed"
        )
        assert cond["status"] == "True"
        assert (
            cond["message"].startswith("spec.redis.passwordSecretRef: ")
            and "'fleet-redis-password'" in (cond["message"])
        )
        # two more rounds with the same wrong password: still one Event, still the same condition
        rounds = timer_rounds()
        wait_for(lambda: timer_rounds() >= rounds + 2, 40, what="two more reconcile rounds")
        said = wait_for(events, 20, what="the RedisAuthFailed Event")
        assert len(said) == 1 and said[0]["type"] == "Warning", [e["message"] for e in said]
        assert said[0]["involvedObject"]["name"] == FLEET and said[0]["message"] == cond["message"]
        assert (degraded() or {}).get("reason") == REDIS_AUTH_FAILED
        fleet = cluster.kubectl_json("get", "pcf", FLEET)
        assert WRONG not in json.dumps([fleet, said])
        # the spec holds the URL; what the fleet says about it does not
        assert guarded_redis not in json.dumps([fleet["status"], said])

        # fixed: the next round dials with the right password and the condition goes away
        cluster.apply(password_secret(PASSWORD))
        wait_for(
            lambda: (c := degraded()) is not None and c["reason"] != REDIS_AUTH_FAILED,
            40,
            what="the fleet to stop showing RedisAuthFailed",
        )
        assert len(events()) == 1
        log = operator.log_path.read_text(errors="replace")
        assert "Traceback" not in log, operator.log_tail(60)
        assert WRONG not in log and PASSWORD not in log
        assert operator.process is not None and operator.process.poll() is None
