"""The ``Deleted`` Event counts every child the deletion removed, also when its first pass failed.

kopf runs ``fleet_deleted`` again when a pass raises (an API server error or timeout midway), by
default a minute later. Before, the Event was posted by the pass that completed with only that
pass's count: a first pass that deleted the replica pods and then failed on the gateway Deployment
left "removed 3 children" for a fleet whose 5 children were all removed. Passes re-run while a
timer of the fleet exits must not count a child twice either (a pod still terminating is deleted,
and answered, again).
"""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException

from prefixfleet.operator.handlers import fleet_deleted
from tests.test_operator_redis_clients import LOG, InProcess, operator  # noqa: F401  (operator: a pytest fixture)
from tests.test_operator_redis_permissions import (  # noqa: F401  (acl_redis: a fixture operator uses)
    ALL_FLEET_KEYS,
    acl_redis,
)


def deleted_messages(operator: InProcess) -> list[str]:  # noqa: F811
    return [kw["message"] for _args, kw in operator.events if kw.get("reason") == "Deleted"]


async def test_a_pass_failing_midway_then_a_retry_count_every_child_once(
    operator: InProcess,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = operator.cluster
    operator.acl.user("fleet-a", *ALL_FLEET_KEYS)
    await operator.reconciles("doomed", "fleet-a", rounds=1)
    pods = cluster.kubectl_json("get", "pods", "-l", "prefixfleet.io/fleet=doomed")["items"]
    assert pods
    children = len(pods) + 3  # and the gateway's Deployment, Service and ConfigMap

    kube = operator.ctx.kube
    delete = kube.delete
    failures = iter([ApiException(status=500, reason="etcdserver: request timed out")])

    def flaky_delete(kind: str, namespace: str, name: str) -> Any:
        if kind == "Deployment" and (failure := next(failures, None)) is not None:
            raise failure
        return delete(kind, namespace, name)

    monkeypatch.setattr(kube, "delete", flaky_delete)
    body = kopf.Body(cluster.kubectl_json("get", "pcf", "doomed"))  # the body kopf hands each pass
    cluster.kubectl("delete", "pcf", "doomed")
    memo = kopf.Memo()
    memo.ctx = operator.ctx
    with pytest.raises(ApiException):  # kopf's first pass: the pods go, then the API server fails
        await fleet_deleted(body=body, memo=memo, logger=LOG)
    assert deleted_messages(operator) == []
    for _ in range(2):  # kopf's retry, then a pass while a timer of the fleet exits
        await fleet_deleted(body=body, memo=memo, logger=LOG)
    assert deleted_messages(operator) == [f"removed {children} children"]
    assert not cluster.kubectl_json("get", "pods", "-l", "prefixfleet.io/fleet=doomed")["items"]
