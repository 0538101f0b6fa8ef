"""A Redis ACL user denied DISCARD is told why its check reconnects every round, once.

The permission check queues the fleet's commands in a transaction it ends with DISCARD (never EXEC:
tests/test_operator_redis_probe_proxy.py). The fleet itself never runs DISCARD, so a user denied it
is not Degraded; but the check must then close its connection to end the transaction, and dials a
new one every round (every 10 s, per fleet). Before, nothing said so: the user saw only the
connections. Now the first round that finds DISCARD denied says it (``ReconcileOutcome.notices``,
logged as a warning on the fleet by the reconcile), naming the ACL user and the minimal user of
docs/operator.md; the rounds after it say nothing while it lasts, and a new stretch is said again.
"""

from __future__ import annotations

import json

from prefixfleet.operator.handlers import OperatorContext, reconcile_in_cluster
from prefixfleet.operator.kube import Kube
from tests.k8s.cluster import emulator_fleet
from tests.test_operator_redis_permissions import ALL_FLEET_KEYS, AclRedis, acl_redis  # noqa: F401
from tests.test_operator_redis_refusals import FLEET, NAMESPACE
from tests.test_operator_redis_refusals_outage import ctx, kube  # noqa: F401


def notices(context: OperatorContext) -> tuple[tuple[str, ...], str]:
    """One reconcile round: what it tells apart from the fleet's status, and Degraded's reason."""
    outcome = reconcile_in_cluster(context, NAMESPACE, FLEET)
    assert outcome is not None
    status = (context.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {})["status"]
    return outcome.notices, next(c["reason"] for c in status["conditions"] if c["type"] == "Degraded")


def test_a_user_denied_discard_is_told_once_per_stretch(
    ctx: OperatorContext,  # noqa: F811
    acl_redis: AclRedis,  # noqa: F811
) -> None:
    url = acl_redis.user("no-discard", *ALL_FLEET_KEYS, "-discard")
    fleet = emulator_fleet(FLEET, NAMESPACE, {"url": url}, replicas=0)
    ctx.kube.request("POST", Kube.path("PrefixCacheFleet", NAMESPACE), body=json.loads(fleet))
    [hint], degraded = notices(ctx)
    assert degraded == "AsExpected"  # nothing of the fleet fails
    assert "ACL user 'no-discard'" in hint and "+discard" in hint and "docs/operator.md" in hint
    assert "new connection every round" in hint
    # not again while it lasts (before: nothing, ever)
    assert notices(ctx) == ((), "AsExpected") and notices(ctx) == ((), "AsExpected")
    # granted: nothing to say; denied again: said again, once
    acl_redis.user("no-discard", *ALL_FLEET_KEYS)
    assert notices(ctx) == ((), "AsExpected")
    acl_redis.user("no-discard", *ALL_FLEET_KEYS, "-discard")
    assert notices(ctx)[0] == (hint,)
    assert notices(ctx)[0] == ()
    # the fleet gone: nothing of it is kept
    ctx.kube.delete("PrefixCacheFleet", NAMESPACE, FLEET)
    assert reconcile_in_cluster(ctx, NAMESPACE, FLEET) is None and ctx.discard_denied == set()
