"""The operator's log lines about a failed Redis call never repeat the fleet's Redis password.

redis-py 8 opens every connection with ``HELLO 3 AUTH <user> <password>``; a Redis older than 6 does
not know HELLO and answers ``unknown command `HELLO`, with args beginning with: `3`, `AUTH`,
`default`, `<password>`,``. The login check (2870a24) names that refusal without Redis's text, but
the operator's other calls (the membership write every reconcile, the autoscaler's reads, a
deletion's cleanup) failed with the same error and logged it as is: the password in the operator's
log every 10 s. ``redis_error_text`` is what they log now.
"""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ResponseError

from prefixfleet.operator.handlers import OperatorContext, ReconcileOutcome, publish_membership
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedPod
from prefixfleet.operator.redis_permissions import redis_error_text
from tests.test_operator_redis_refusals import fake_redis

PASSWORD = "pw-9f3c1e"  # distinctive: any occurrence in a log line is this one
SPEC = FleetSpec.model_validate({"model": {"name": "m"}, "engine": {"kind": "emulator"}})
REF = FleetRef(name="old", namespace="team-a")


async def test_a_membership_write_to_a_redis_older_than_6_logs_no_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pods = (ObservedPod(name="old-0", phase="Running", ready=True, pod_ip="10.0.0.1"),)
    logger = logging.getLogger("test.operator.redis_error_text")
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]  # membership never calls the API server
    with fake_redis(version=5, password=PASSWORD) as fake:
        outcome = ReconcileOutcome({}, spec=SPEC, ref=REF, pods=pods, redis_url=fake.url(":" + PASSWORD))
        try:
            with caplog.at_level(logging.WARNING, logger=logger.name):
                await publish_membership(ctx, outcome, logger)
        finally:
            for client in ctx.redis_clients.values():
                await client.aclose()
    (line,) = [r.getMessage() for r in caplog.records if r.name == logger.name]
    # before: "... with args beginning with: `3`, `AUTH`, `default`, `pw-9f3c1e`, "
    assert PASSWORD not in line, line
    assert line == (
        f"membership of {REF.redis_fleet} not published (Redis: HELLO (every Redis client of the fleet,"
        " as it connects: Redis 6 or later): ERR unknown command (a Redis older than 6));"
        " retrying on the next reconcile"
    )


@pytest.mark.parametrize(
    "text",
    [
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "unknown command `FOO`, with args beginning with: `x`, ",  # not the handshake: said as is
        "Connection closed by server.",
    ],
)
def test_other_errors_are_said_as_redis_said_them(text: str) -> None:
    assert redis_error_text(ResponseError(text)) == text
    assert redis_error_text(OSError(text)) == text
