"""A fleet's deletion posts its ``Deleted`` Event once, even when kopf runs the deletion handler again.

kopf keeps a deleted fleet's finalizer until the fleet's timers have stopped and re-processes the
deletion every ``TIMER_EXIT_POLL_S`` (2 s) meanwhile (aa6d63a); each pass runs ``fleet_deleted``,
which finds nothing left to remove. ``kubectl describe pcf`` should not fill with "removed 0
children" Events, one per pass.
"""

from __future__ import annotations

from tests.test_operator_redis_clients import InProcess, operator  # noqa: F401  (operator: a pytest fixture)
from tests.test_operator_redis_permissions import (  # noqa: F401  (acl_redis: a fixture operator uses)
    ALL_FLEET_KEYS,
    acl_redis,
)


async def test_a_deletion_processed_three_times_posts_one_deleted_event(
    operator: InProcess,  # noqa: F811
) -> None:
    cluster = operator.cluster
    operator.acl.user("fleet-a", *ALL_FLEET_KEYS)
    await operator.reconciles("doomed", "fleet-a", rounds=1)
    assert cluster.kubectl_json("get", "pods", "-l", "prefixfleet.io/fleet=doomed")["items"]
    # kopf's first pass, then two re-checks while a timer is still exiting
    await operator.delete("doomed", passes=3)
    deleted = [kw for _args, kw in operator.events if kw.get("reason") == "Deleted"]
    assert len(deleted) == 1, deleted
    assert deleted[0]["message"].startswith("removed ") and deleted[0]["message"] != "removed 0 children"
    assert not cluster.kubectl_json("get", "pods", "-l", "prefixfleet.io/fleet=doomed")["items"]
