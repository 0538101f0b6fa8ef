"""A fleet deleted with no children still gets its ``Deleted`` Event, once.

Before, ``fleet_deleted`` posted the Event only when it removed something, so that the passes kopf
makes while a timer of the fleet is still exiting (each finding nothing left) did not post
"removed 0 children" each. A fleet with no children at all (its spec refused from the start, or
children already removed by a foreground cascade) then went without any: ``kubectl get events``
showed nothing for its deletion. Now the first pass of each deletion (by the fleet's uid) posts it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from prefixfleet.operator.handlers import fleet_gone
from tests.k8s.cluster import EmulatedCluster, OperatorProcess, operator_in_cluster, running_redis, wait_for
from tests.test_operator_redis_clients import InProcess, operator  # noqa: F401  (operator: a pytest fixture)
from tests.test_operator_redis_permissions import acl_redis  # noqa: F401  (a fixture operator uses)

FLEET = "childless"
# engine.kind the CRD's schema refuses: let in with the emulator's schema check off, the operator
# refuses it too (InvalidSpec) and creates no child
REFUSED = {"apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet", "metadata": {"name": FLEET},
           "spec": {"model": {"name": "m"}, "engine": {"kind": "tpu"}, "replicas": 2}}  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[EmulatedCluster, OperatorProcess]]:
    with running_redis(tmp_path) as url, operator_in_cluster(tmp_path, url, kubelet=False) as env_:
        yield env_


def apply_refused(cluster: EmulatedCluster) -> None:
    cluster.api.server.validate_custom_resources = False
    cluster.apply(json.dumps(REFUSED))


def fleet_events(cluster: EmulatedCluster, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={FLEET},reason={reason}"
    return cluster.kubectl_json("get", "events", "--field-selector", selector)["items"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kubectl_delete_of_a_fleet_with_no_children_shows_a_deleted_event(
    env: tuple[EmulatedCluster, OperatorProcess],
) -> None:
    cluster, operator_ = env
    apply_refused(cluster)
    wait_for(lambda: fleet_events(cluster, "InvalidSpec"), 40, what="the operator refusing the fleet")
    assert not cluster.kubectl_json("get", "pods", "-l", f"prefixfleet.io/fleet={FLEET}")["items"]

    cluster.kubectl("delete", "pcf", FLEET, "--wait=true", timeout=60)
    deleted = wait_for(lambda: fleet_events(cluster, "Deleted"), 30, what="a Deleted Event for the fleet")
    assert [e["message"] for e in deleted] == ["removed 0 children"]
    # the fleet gone, the operator forgets that it said so (fleet_gone ran on the DELETED event)
    wait_for(lambda: "Handler 'fleet_gone' succeeded" in operator_.log_tail(400), 20, what="fleet_gone")


async def test_a_childless_deletion_processed_three_times_posts_one_deleted_event(
    operator: InProcess,  # noqa: F811
) -> None:
    apply_refused(operator.cluster)  # never reconciled: no child
    await operator.delete(FLEET, passes=3)
    deleted = [kw for _args, kw in operator.events if kw.get("reason") == "Deleted"]
    assert [kw["message"] for kw in deleted] == ["removed 0 children"]


async def test_a_fleet_created_again_under_the_name_gets_its_own_deleted_event(
    operator: InProcess,  # noqa: F811
) -> None:
    for _ in range(2):  # a new uid each time
        apply_refused(operator.cluster)
        await operator.delete(FLEET, passes=2)
    deleted = [kw for _args, kw in operator.events if kw.get("reason") == "Deleted"]
    assert len(deleted) == 2, deleted


async def test_the_deletion_said_is_forgotten_once_the_fleet_is_gone(
    operator: InProcess,  # noqa: F811
) -> None:
    apply_refused(operator.cluster)
    body = operator.cluster.kubectl_json("get", "pcf", FLEET)
    await operator.delete(FLEET)
    assert len(operator.ctx.deletions_said) == 1
    memo = kopf.Memo()
    memo.ctx = operator.ctx
    fleet_gone(body=kopf.Body(body), memo=memo, type="DELETED")
    assert operator.ctx.deletions_said == set()
