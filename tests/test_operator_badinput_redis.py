"""A fleet whose Redis comes from a Secret that cannot be used: said on the fleet, not a traceback.

The CRD checks ``spec.redis.url`` at apply time, but the URL behind ``spec.redis.secretRef`` (and the
password behind ``passwordSecretRef``) is only known when the operator reads the Secret. Specification:

* a Secret or key that is missing, a URL in it that the sidecar would refuse at start (an IPv6 host
  without brackets, a port outside 1..65535, not a redis:// URL) or a Secret the operator may not
  read make the fleet ``Degraded`` with reason ``RedisUnusable`` and a message naming the field and
  the Secret — never the URL itself, which may hold a password;
* one Warning Event says it when it starts or changes, not one per reconcile round;
* the operator keeps running, logs no traceback, and does not connect to an unusable URL; once the
  Secret is fixed the condition goes away (the next round reads the Secret again);
* the rule that judges the URL is the sidecar's (``--redis``: scheme, then ``authority_error``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixfleet.operator.handlers import fleet_redis, resolve_redis_url
from prefixfleet.router.addresses import redis_url_error
from tests.k8s.cluster import emulator_fleet, operator_in_cluster, running_redis, wait_for

pytestmark = pytest.mark.slow

FLEET = "secretive"
NAMESPACE = "default"
SECRET_REF = {"name": "fleet-redis", "key": "url"}


# ------------------------------------------------------------------ the rule (pure)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://fd00::12:6379/0", "an IPv6 address goes in brackets"),
        ("redis://r:0/0", "the port '0' is not a number in 1..65535"),
        ("redis://r:6379\n", "the port '6379\\n' is not a number"),  # a Secret written with echo
        ("http://r:6379", "not a redis://, rediss:// or unix:// URL"),
        ("", "not a redis://, rediss:// or unix:// URL"),
    ],
)
def test_a_url_the_sidecar_would_refuse_is_refused(url: str, says: str) -> None:
    problem = redis_url_error(url)
    assert problem is not None and says in problem


@pytest.mark.parametrize(
    "url", ["redis://[fd00::12]:6379/0", "rediss://:pw@r:6380", "unix:///run/valkey.sock", "redis://r/0\n"]
)
def test_a_url_the_sidecar_accepts_is_accepted(url: str) -> None:
    assert redis_url_error(url) is None


class Secrets:
    """Kube's read_secret_key over a dict: (namespace, name) -> {key: value}, or an exception."""

    def __init__(self, secrets: dict[str, Any]) -> None:
        self.secrets = secrets
        self.reads: list[str] = []

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        self.reads.append(name)
        found = self.secrets.get(name)
        if isinstance(found, Exception):
            raise found
        return None if found is None else found.get(key)


class Ctx:
    """The part of OperatorContext fleet_redis and resolve_redis_url read."""

    def __init__(self, secrets: dict[str, Any]) -> None:
        self.kube = Secrets(secrets)
        self.default_redis_url = "redis://default:6379/0"


def resolved(secrets: dict[str, Any], redis: dict[str, Any]) -> tuple[str, str]:
    got = fleet_redis(Ctx(secrets), NAMESPACE, redis)  # type: ignore[arg-type]
    return got.url, got.problem


def dialled(secrets: dict[str, Any], redis: dict[str, Any]) -> str:
    """The URL the operator itself connects to."""
    return resolve_redis_url(Ctx(secrets), NAMESPACE, {"redis": redis})  # type: ignore[arg-type]


def test_a_missing_secret_or_key_is_named() -> None:
    url, problem = resolved({}, {"secretRef": SECRET_REF})
    assert url == "" and problem.startswith("spec.redis.secretRef: ")
    assert "Secret 'fleet-redis'" in problem and "'url'" in problem
    url, problem = resolved({"fleet-redis": {"other": "x"}}, {"secretRef": SECRET_REF})
    assert url == "" and "has no key 'url'" in problem


def test_an_unusable_url_in_the_secret_is_named_without_the_url() -> None:
    secret = {"fleet-redis": {"url": "redis://:hunter2@fd00::12:6379/0"}}
    url, problem = resolved(secret, {"secretRef": SECRET_REF})
    assert url == "" and problem.startswith("spec.redis.secretRef: the URL in Secret 'fleet-redis' key 'url'")
    assert "brackets" in problem and "hunter2" not in problem
    assert dialled(secret, {"secretRef": SECRET_REF}) == ""


@pytest.mark.parametrize(
    "url",
    [
        "redis://:Zm9v/YmFy+Q==@r:6379/0",  # a base64 password: its '/' ends the host part
        "redis://alice:hun#ter2@r:6379/0",
        "redis://alice:hun?ter2@r:6379/0",
        "redis://:[hun/ter2@r:6379/0",
    ],
)
def test_a_password_that_cuts_the_host_short_is_not_quoted(url: str) -> None:
    # the sidecar (and redis-py) read the host and port up to the first '/', '?' or '#', so they
    # refuse these; the reason says what to encode and repeats no piece of the password
    secret = {"fleet-redis": {"url": url}}
    got, problem = resolved(secret, {"secretRef": SECRET_REF})
    assert got == "" and problem.startswith("spec.redis.secretRef: the URL in Secret 'fleet-redis' key 'url'")
    assert "%2F" in problem
    userinfo = url.partition("://")[2].rpartition("@")[0]
    pieces = [p for p in userinfo.replace("?", "/").replace("#", "/").replace(":", "/").split("/") if p]
    assert pieces and not any(piece in problem for piece in pieces), problem


def test_a_missing_password_secret_is_named() -> None:
    redis = {"passwordSecretRef": {"name": "pw", "key": "password"}}
    url, problem = resolved({}, redis)
    assert problem.startswith("spec.redis.passwordSecretRef: ") and "Secret 'pw'" in problem
    # the pods' URL (and so their template) stays; the operator does not dial it without the password
    assert url == "redis://default:6379/0" and dialled({}, redis) == ""
    assert dialled({"pw": {"password": "s3cret"}}, redis) == "redis://:s3cret@default:6379/0"


def test_each_secret_is_read_once_per_resolution() -> None:
    # one reconcile round checks the Secrets and builds the URL it dials from the same reads
    ctx = Ctx({"fleet-redis": {"url": "redis://r:6379/0"}, "pw": {"password": "s3cret"}})
    redis = {"secretRef": SECRET_REF, "passwordSecretRef": {"name": "pw", "key": "password"}, "tls": True}
    got = fleet_redis(ctx, NAMESPACE, redis)  # type: ignore[arg-type]
    assert (got.url, got.problem, got.dial_url) == ("redis://r:6379/0", "", "rediss://:s3cret@r:6379/0")
    assert sorted(ctx.kube.reads) == ["fleet-redis", "pw"]
    assert "s3cret" not in repr(got)


def test_a_secret_the_operator_may_not_read_is_named() -> None:
    from kubernetes.client.rest import ApiException

    url, problem = resolved(
        {"fleet-redis": ApiException(status=403, reason="Forbidden")}, {"secretRef": SECRET_REF}
    )
    assert url == "" and problem.startswith("spec.redis.secretRef: ") and "may not read" in problem


def test_a_usable_secret_and_the_default_are_used() -> None:
    secret = {"fleet-redis": {"url": "redis://[fd00::12]:6379/0"}}
    assert resolved(secret, {"secretRef": SECRET_REF}) == ("redis://[fd00::12]:6379/0", "")
    assert resolved({}, {}) == ("redis://default:6379/0", "")


# ------------------------------------------------------------------ the operator


def secret_manifest(url: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_REF["name"], "namespace": NAMESPACE},
            "data": {"url": base64.b64encode(url.encode()).decode()},
        }
    )


def fleet_manifest() -> str:
    return emulator_fleet(FLEET, NAMESPACE, {"secretRef": SECRET_REF})


def test_the_operator_says_which_secret_is_unusable_and_recovers_once_fixed(tmp_path: Path) -> None:
    with (
        running_redis(tmp_path) as redis_url,
        operator_in_cluster(tmp_path, redis_url, kubelet=False) as (cluster, operator),
    ):
        cluster.apply(fleet_manifest())  # no Secret yet

        def degraded(reason: str) -> dict[str, Any] | None:
            status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
            cond = next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)
            return cond if cond and cond["reason"] == reason else None

        cond = wait_for(lambda: degraded("RedisUnusable"), 40, what="Degraded=RedisUnusable (no Secret)")
        assert cond["message"].startswith("spec.redis.secretRef: ") and "'fleet-redis'" in cond["message"]

        # the URL in it is one the sidecar would refuse at start
        cluster.apply(secret_manifest("redis://:hunter2@::1:6379/0"))
        cond = wait_for(
            lambda: (c := degraded("RedisUnusable")) and "brackets" in c["message"] and c,
            40,
            what="Degraded=RedisUnusable naming the unbracketed host",
        )
        assert "hunter2" not in json.dumps(cluster.kubectl_json("get", "pcf", FLEET))
        events = wait_for(
            lambda: cluster.kubectl_json("get", "events", "--field-selector", "reason=RedisUnusable")[
                "items"
            ],
            20,
            what="the RedisUnusable Events",
        )
        assert all(e["involvedObject"]["name"] == FLEET and e["type"] == "Warning" for e in events), events

        # fixed: the fleet's Redis is the Secret's, and the condition goes away
        cluster.apply(secret_manifest(redis_url))
        wait_for(
            lambda: degraded("RedisUnusable") is None, 40, what="the fleet to stop showing RedisUnusable"
        )
        # one Event per distinct problem (missing Secret, then the unbracketed URL), not one per round
        events = cluster.kubectl_json("get", "events", "--field-selector", "reason=RedisUnusable")["items"]
        assert len(events) == 2, [e["message"] for e in events]
        log = operator.log_path.read_text(errors="replace")
        assert "Traceback" not in log, operator.log_tail(60)
        assert "hunter2" not in log
        assert operator.process is not None and operator.process.poll() is None

        # broken again, then deleted: the finalizer's clean-up skips the unusable Redis, the fleet goes
        # (redis-py raised ValueError on it, which the deletion handler did not catch)
        cluster.apply(secret_manifest("redis://fd00::12:6379/0"))
        wait_for(lambda: degraded("RedisUnusable"), 40, what="Degraded=RedisUnusable again")
        cluster.kubectl("delete", "pcf", FLEET, "--wait=false")
        wait_for(
            lambda: cluster.kubectl("get", "pcf", FLEET, check=False).returncode != 0,
            40,
            what="the fleet gone",
        )
        assert "Traceback" not in operator.log_path.read_text(errors="replace"), operator.log_tail(60)


# ------------------------------------------------------------------ what the fleet shows (pure)


def test_the_fleet_is_degraded_with_one_event_per_problem() -> None:
    from prefixfleet.operator.models import validate_spec
    from prefixfleet.operator.planner import REDIS_UNUSABLE, FleetRef, ObservedState, plan_reconcile

    fleet = FleetRef(name=FLEET, namespace=NAMESPACE, uid="uid", generation=1)
    spec = validate_spec(
        {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "redis": {"secretRef": SECRET_REF}}
    )
    problem = (
        "spec.redis.secretRef: Secret 'fleet-redis' in namespace 'default' is missing or has no key 'url'"
    )
    plan = plan_reconcile(fleet, spec, ObservedState(redis_problem=problem))
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == ("True", REDIS_UNUSABLE, problem)
    assert [e.reason for e in plan.events if e.type == "Warning"] == [REDIS_UNUSABLE]
    # the next round, with the condition on the fleet: nothing new to say
    again = plan_reconcile(
        fleet, spec, ObservedState(redis_problem=problem, conditions=plan.status["conditions"])
    )
    assert not [e for e in again.events if e.reason == REDIS_UNUSABLE]


# ------------------------------------------------------------------ spec.redis.url itself


def fleet_with_url(url: str) -> str:
    fleet = yaml.safe_load(fleet_manifest())
    fleet["spec"]["redis"] = {"url": url}
    return json.dumps(fleet)


def test_an_unbracketed_ipv6_redis_url_is_refused_at_apply_and_by_the_operator(tmp_path: Path) -> None:
    with (
        running_redis(tmp_path) as redis_url,
        operator_in_cluster(tmp_path, redis_url, kubelet=False) as (cluster, operator),
    ):
        # kubectl apply: the API server (the CRD's CEL rule) refuses it, naming the field
        refused = cluster.kubectl(
            "apply",
            "--validate=false",
            "-f",
            "-",
            stdin=fleet_with_url("redis://fd00::12:6379/0"),
            check=False,
        )
        assert (
            refused.returncode != 0 and "spec.redis.url: the host and port cannot be read" in refused.stderr
        )

        # a fleet stored before the CRD had the rule: the operator refuses it itself and acts on nothing
        cluster.api.server.validate_custom_resources = False
        cluster.apply(fleet_with_url("redis://fd00::12:6379/0"))

        def degraded() -> dict[str, Any] | None:
            status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
            return next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)

        cond = wait_for(
            lambda: (c := degraded()) and c["reason"] == "InvalidSpec" and c, 40, what="InvalidSpec"
        )
        assert cond["message"] == (
            "spec.redis.url: an IPv6 address goes in brackets: write redis://[fd00::12]:6379/0"
        )
        assert cluster.api.objects("pods", namespace=NAMESPACE) == []
        assert "Traceback" not in operator.log_path.read_text(errors="replace"), operator.log_tail(60)


def test_an_autoscaled_fleet_without_any_redis_says_so_and_the_operator_keeps_running(tmp_path: Path) -> None:
    # no spec.redis and an operator run without --redis: nothing to publish members to or to read
    # the replicas' load from; the fleet says which fields would give it one
    with operator_in_cluster(tmp_path, "", kubelet=False) as (cluster, operator):
        fleet = yaml.safe_load(fleet_manifest())
        del fleet["spec"]["redis"]
        fleet["spec"]["autoscaling"] = {
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 3,
            "intervalSeconds": 1,
        }
        cluster.apply(json.dumps(fleet))

        def degraded() -> dict[str, Any] | None:
            status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
            return next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)

        cond = wait_for(lambda: (c := degraded()) and c["reason"] == "NoRedis" and c, 40, what="NoRedis")
        assert "spec.redis.url" in cond["message"] and "--redis" in cond["message"]
        # a few autoscaler rounds (1 s apart) later: still running, nothing raised
        wait_for(
            lambda: (
                operator.log_path.read_text(errors="replace").count("Timer 'autoscale_timer' succeeded") >= 3
            ),
            20,
            what="three autoscaler rounds",
        )
        log = operator.log_path.read_text(errors="replace")
        assert "Traceback" not in log, operator.log_tail(60)
        assert operator.process is not None and operator.process.poll() is None
