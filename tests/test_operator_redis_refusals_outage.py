"""RedisCommandsRefused stands through a Redis outage, as RedisAccessDenied does.

A fleet whose Redis refuses its commands for a reason about neither the credentials nor the ACL (a
read-only replica, out of memory, a failed snapshot) is Degraded=True, reason RedisCommandsRefused,
with one Warning Event when that starts or changes (tests/test_operator_redis_refusals.py). Before,
any round whose checks got no answer (the connection closed or reset, the probe timed out, Redis
unreachable) set it to "nothing refused": the condition cleared, and when Redis answered the same
refusal again the Warning Event was posted anew, once per blip of a flaky link. Now such a round
decides nothing (``planner.refused_verdict``): the fleet keeps its last verdict, same condition, same
transition time, no Event, until Redis answers again, which keeps it or clears it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import (
    REDIS_AUTH_FAILED,
    REDIS_COMMANDS_REFUSED,
    ObservedState,
    plan_reconcile,
    refused_verdict,
)
from tests.k8s.cluster import EmulatedCluster, emulator_fleet
from tests.test_operator_redis_refusals import FLEET, NAMESPACE, PREFIX, REF, SPEC, FakeRedis, Session

READONLY = "READONLY You can't write against a read only replica."
REFUSED = "the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: ..."

# ------------------------------------------------------------------ the verdict (plain data)


def warnings(observed: ObservedState) -> tuple[list[str], dict[str, Any]]:
    """The Warning Events of a round and its Degraded condition."""
    plan = plan_reconcile(REF, SPEC, observed)
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    return [e.reason for e in plan.events if e.type == "Warning"], degraded


def test_a_round_without_an_answer_keeps_the_last_verdict() -> None:
    url = "redis://r/0"
    said, degraded = warnings(ObservedState(redis_url=url, redis_refused=refused_verdict(REFUSED, [])))
    assert (said, degraded["reason"]) == ([REDIS_COMMANDS_REFUSED], REDIS_COMMANDS_REFUSED)
    shown = [degraded]
    # no answer (None): the verdict stands, no Event (before: "" every such round, which cleared it)
    assert refused_verdict(None, shown) == REFUSED
    held = ObservedState(redis_url=url, redis_refused=refused_verdict(None, shown), conditions=shown)
    said, kept = warnings(held)
    assert (said, kept) == ([], degraded)
    # an answer decides: the same refusal again, nothing new; none, cleared
    assert refused_verdict(REFUSED, shown) == REFUSED
    assert refused_verdict("", shown) == ""
    # nothing to keep: a fleet not Degraded for it, or Degraded for another reason
    assert refused_verdict(None, []) == ""
    other = dict(degraded, reason=REDIS_AUTH_FAILED, message="wrong password")
    assert refused_verdict(None, [other]) == ""
    assert refused_verdict(None, [dict(degraded, status="False")]) == ""


# ------------------------------------------------------------------ the round, as the operator runs it


class FlakyRedis(FakeRedis):
    """The fake Redis of tests/test_operator_redis_refusals.py, which can also leave a command
    unanswered (``hang_on``) until the test ends: the client times out waiting."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hang_on = ""
        self.released = threading.Event()

    def answer(self, s: Session, argv: list[str]) -> str | None:
        if argv[0].upper() == self.hang_on:
            self.released.wait()
            return None
        return super().answer(s, argv)


@pytest.fixture
def flaky() -> Iterator[FlakyRedis]:
    fake = FlakyRedis(refuse={"HSET": READONLY})
    try:
        yield fake
    finally:
        fake.released.set()
        fake.close()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Kube]:
    with contextlib.closing(EmulatedCluster(tmp_path / "cluster")) as cluster:
        cluster.install_crd()
        yield Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))


@pytest.fixture
def ctx(kube: Kube) -> Iterator[OperatorContext]:
    context = OperatorContext(kube=kube)
    yield context
    for client in context.sync_redis_clients.values():
        client.close()


def round_said(ctx: OperatorContext) -> tuple[list[str], dict[str, Any]]:
    """One reconcile round: its Warning Events, and the fleet's Degraded condition after it."""
    outcome = reconcile_in_cluster(ctx, NAMESPACE, FLEET)
    assert outcome is not None
    fleet = ctx.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {}
    degraded = next(c for c in fleet["status"]["conditions"] if c["type"] == "Degraded")
    return [e.reason for e in outcome.events if e.type == "Warning"], degraded


def test_an_outage_neither_clears_redis_commands_refused_nor_posts_it_again(
    ctx: OperatorContext, flaky: FlakyRedis
) -> None:
    fleet = emulator_fleet(FLEET, NAMESPACE, {"url": flaky.url()}, replicas=0)
    ctx.kube.request("POST", Kube.path("PrefixCacheFleet", NAMESPACE), body=json.loads(fleet))
    said, first = round_said(ctx)
    assert (said, first["reason"]) == ([REDIS_COMMANDS_REFUSED], REDIS_COMMANDS_REFUSED)
    assert f"HSET on key {PREFIX}members" in first["message"] and READONLY in first["message"]

    # the link drops: mid-probe (the login was accepted), at the login's PING, and a probe that
    # times out. Each round decides nothing: the condition stands as it was, and no Event (before:
    # the first such round cleared it)
    for blip in ("close MULTI", "close PING", "hang MULTI"):
        how, command = blip.split()
        flaky.close_on, flaky.hang_on = (command, "") if how == "close" else ("", command)
        assert round_said(ctx) == ([], first), blip
    # Redis answers the same refusal again: still nothing new (before: a second Warning Event)
    flaky.close_on = flaky.hang_on = ""
    assert round_said(ctx) == ([], first)
    # Redis takes the commands again: the round decides, the condition clears
    flaky.refuse = {}
    said, cleared = round_said(ctx)
    assert said == [] and cleared["reason"] != REDIS_COMMANDS_REFUSED, cleared
