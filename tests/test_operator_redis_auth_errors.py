"""An AUTH answered with an error that is no refusal of the credentials is named, not an outage.

The operator proves the fleet's credentials each round with an explicit ``AUTH`` (then ``PING``).
Two answers to it are errors that are not a wrong password:

* a Redis with no password set, while the fleet gives one (its URL, or spec.redis.passwordSecretRef):
  Redis 6+ answers ``AUTH <password> called without any password configured...``, Redis 5 ``Client
  sent AUTH, but no password is set``. redis-py raises both as an AuthenticationError, so the fleet
  said RedisAuthFailed, "a wrong password, or an unknown or disabled user", and the operator stopped
  dialling that Redis (no membership published), although the fleet's pods, whose redis-py >= 8 logs
  in with ``HELLO 3 AUTH default <password>``, which a default user without a password takes,
  connect. The real cause is a misconfiguration to fix: the password protects nothing, and a client
  logging in with ``AUTH <password>`` (RESP2) is refused. Now it is said so, naming the field that
  holds the password and the two fixes, as RedisCommandsRefused: the round still dials that Redis;
* a proxy without ``AUTH`` (``ERR unknown command 'AUTH'``): a plain error, which read as an
  outage (nothing said, nothing more asked, every round). Now RedisCommandsRefused names AUTH (never
  the server's text, which may quote the arguments, the password among them). Without credentials
  the fleet sends no AUTH: the operator's own probe of the default user being refused so tells
  nothing, and the PING answers, as with a Redis older than 6.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_fixtures import RedisServer, free_port

from prefixfleet.operator.handlers import (
    FleetRedis,
    OperatorContext,
    no_password_problem,
    reconcile_in_cluster,
)
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import REDIS_COMMANDS_REFUSED
from tests.k8s.cluster import emulator_fleet
from tests.test_operator_redis_refusals import FLEET, NAMESPACE, fake_redis
from tests.test_operator_redis_refusals_outage import ctx, kube  # noqa: F401

PASSWORD = "fleet-secret-pw"


@pytest.fixture
def open_redis() -> Iterator[RedisServer]:
    """A real Redis-compatible server with no password set (its default user takes none)."""
    with tempfile.TemporaryDirectory(prefix="pf-redis-") as directory:
        server = RedisServer(free_port(), Path(directory))
        server.start()
        try:
            yield server
        finally:
            server.stop()


def round_on(context: OperatorContext, url: str) -> tuple[list[tuple[str, str]], dict[str, Any], str]:
    """A fleet on ``url``, one reconcile round: its Warning Events, its Degraded condition, and the
    URL the round dialled for membership ("" when it dialled none)."""
    fleet = emulator_fleet(FLEET, NAMESPACE, {"url": url}, replicas=0)
    context.kube.request("POST", Kube.path("PrefixCacheFleet", NAMESPACE), body=json.loads(fleet))
    outcome = reconcile_in_cluster(context, NAMESPACE, FLEET)
    assert outcome is not None
    status = (context.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {})["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    said = [(e.reason, e.message) for e in outcome.events if e.type == "Warning"]
    return said, degraded, outcome.redis_url


def test_a_password_given_to_a_redis_without_one_is_named_a_misconfiguration(
    ctx: OperatorContext,  # noqa: F811
    open_redis: RedisServer,
) -> None:
    said, degraded, dialled = round_on(ctx, f"redis://:{PASSWORD}@127.0.0.1:{open_redis.port}/0")
    message = degraded["message"]
    # before: RedisAuthFailed, "...refused its user and password (a wrong password, or an unknown or
    # disabled user)", and nothing dialled
    assert (degraded["status"], degraded["reason"]) == ("True", REDIS_COMMANDS_REFUSED), degraded
    assert message.startswith(
        "spec.redis.url: the URL: the fleet gives its Redis a password, but that Redis has none set"
    )
    assert "CONFIG SET requirepass" in message and "take the password out of the fleet" in message
    assert PASSWORD not in message
    assert (REDIS_COMMANDS_REFUSED, message) in said
    assert dialled  # the fleet's clients connect (HELLO 3 AUTH default ...): membership goes on


@pytest.mark.parametrize(
    "error",
    ["ERR unknown command 'AUTH'", f"ERR unknown command `AUTH`, with args beginning with: `{PASSWORD}`, "],
)
def test_a_proxy_without_auth_is_named_not_an_outage(ctx: OperatorContext, error: str) -> None:  # noqa: F811
    with fake_redis(password=PASSWORD, refuse={"AUTH": error}) as fake:
        said, degraded, dialled = round_on(ctx, fake.url(f":{PASSWORD}"))
    # before: an outage, so nothing said, every round
    assert (degraded["status"], degraded["reason"]) == ("True", REDIS_COMMANDS_REFUSED), degraded
    assert "AUTH (" in degraded["message"] and "unknown command" in degraded["message"]
    assert PASSWORD not in degraded["message"] and (REDIS_COMMANDS_REFUSED, degraded["message"]) in said
    assert dialled


def test_without_credentials_a_proxy_without_auth_says_nothing(ctx: OperatorContext) -> None:  # noqa: F811
    # the fleet sends no AUTH: the operator's probe of the default user is its own; the PING answers
    with fake_redis(refuse={"AUTH": "ERR unknown command 'AUTH'"}) as fake:
        said, degraded, dialled = round_on(ctx, fake.url())
    assert degraded["reason"] != REDIS_COMMANDS_REFUSED and said == [] and dialled, degraded


def test_a_password_from_its_secret_is_named_by_the_secret() -> None:
    spec = {"url": "redis://r:6379/0", "passwordSecretRef": {"name": "redis-auth", "key": "password"}}
    message = no_password_problem(spec, FleetRedis("redis://r:6379/0"))
    assert message.startswith(
        "spec.redis.passwordSecretRef: the password in Secret 'redis-auth' key 'password': the fleet"
        " gives its Redis a password, but that Redis has none set"
    )
