"""A fleet's deletion posts its ``Deleted`` Event once, even when kopf runs the deletion handler again.

kopf keeps a deleted fleet's finalizer until the fleet's timers have stopped and re-processes the
deletion every ``TIMER_EXIT_POLL_S`` (2 s) meanwhile (aa6d63a); each pass runs ``fleet_deleted``,
which finds nothing left to remove. ``kubectl describe pcf`` should not fill with "removed 0
children" Events, one per pass.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import kopf
import pytest

from prefixfleet.operator.handlers import OperatorContext, fleet_deleted, reconcile
from tests.k8s.cluster import EmulatedCluster
from tests.test_operator_redis_permissions import (  # noqa: F401  (acl_redis: a pytest fixture)
    ALL_FLEET_KEYS,
    NAMESPACE,
    AclRedis,
    acl_redis,
    fleet_manifest,
    in_process_kube,
)

LOG = logging.getLogger("test_operator_deleted_event_once")


async def test_a_deletion_processed_three_times_posts_one_deleted_event(
    tmp_path: Path,
    acl_redis: AclRedis,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "info", lambda _body, **kw: posted.append(kw))
    monkeypatch.setattr(kopf, "event", lambda _body, **kw: posted.append(kw))
    acl_redis.user("fleet-a", *ALL_FLEET_KEYS)
    cluster = EmulatedCluster(tmp_path / "cluster")
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    try:
        ctx.kube = in_process_kube(cluster)
        cluster.apply(fleet_manifest(f"redis://fleet-a@127.0.0.1:{acl_redis.port}/0", "doomed"))
        await reconcile(ctx, NAMESPACE, "doomed", LOG)
        assert cluster.kubectl_json("get", "pods", "-l", "prefixfleet.io/fleet=doomed")["items"]
        body = cluster.kubectl_json("get", "pcf", "doomed")
        cluster.kubectl("delete", "pcf", "doomed")
        memo = kopf.Memo()
        memo.ctx = ctx
        for _ in range(3):  # kopf's first pass, then two re-checks while a timer is still exiting
            await fleet_deleted(body=kopf.Body(body), memo=memo, logger=LOG)
        deleted = [e for e in posted if e.get("reason") == "Deleted"]
        assert len(deleted) == 1, deleted
        assert deleted[0]["message"].startswith("removed ") and deleted[0]["message"] != "removed 0 children"
        assert not cluster.kubectl_json("get", "pods", "-l", "prefixfleet.io/fleet=doomed")["items"]
    finally:
        for client in ctx.redis_clients.values():
            await client.aclose()
        for sync_client in ctx.sync_redis_clients.values():
            sync_client.close()
        cluster.close()
