"""A replica the operator drains stays ``draining`` in membership when its warm-up ends meanwhile.

The autoscaler marks a new pod ``prefixfleet.io/state: warming`` and, when its warm-up ends (or
fails, or is skipped), removes the mark (``autoscale_handlers._unmark``, a merge patch setting the
annotation to null) so membership publishes it ready. The reconcile drains a pod by setting that same
annotation to ``draining`` (with ``prefixfleet.io/draining-since``), and only once. A pod chosen for
removal while it warmed (maxReplicas lowered during a scale-up: the autoscaler names warming pods
first; a ``kubectl scale`` down: the newest pod goes first) lost its ``draining`` to the warm-up's
unmark: membership published it ``ready``, gateways sent it new requests during its drain, and the
reconcile deleted it under them after PREFIXFLEET_DRAIN_SECONDS. Membership now publishes a pod with
``draining-since`` as ``draining`` whatever ``state`` says.

In-process on the emulated API server with a real Redis-compatible server: the operator's reconcile
and the autoscaler's unmark, as they run in the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import kopf
import pytest
import redis

from prefixfleet.operator.autoscale_handlers import _unmark
from prefixfleet.operator.handlers import ANNOTATION_VICTIMS, OperatorContext, reconcile
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.membership import desired_members
from prefixfleet.operator.models import validate_spec
from prefixfleet.operator.planner import ANNOTATION_STATE, ObservedPod
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_member
from tests.k8s.cluster import running_redis
from tests.test_autoscale_round_races import FLEET_PATH, fleet_manifest, kube  # noqa: F401  (kube: a fixture)

FLEET = "auto"
LOG = logging.getLogger("test.drain_outlives_warm_mark")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with running_redis(tmp_path) as url:
        yield url


def make_ready(api: Kube, name: str) -> None:
    """What the kubelet reports of a started replica pod: Running, Ready, its IP."""
    api.request(
        "PATCH",
        api.path("Pod", "default", name, "status"),
        body={"status": {"phase": "Running", "podIP": "127.0.0.1",
                         "conditions": [{"type": "Ready", "status": "True"}]}},
        content_type="application/merge-patch+json",
    )  # fmt: skip


def member_states(redis_url: str) -> dict[str, str]:
    with redis.Redis.from_url(redis_url) as client:
        raw = client.hgetall(FleetKeys(f"default.{FLEET}").members)
    return {k.decode(): decode_member(v).state for k, v in raw.items()}


async def test_a_pod_drained_while_it_warmed_is_published_draining_after_its_unmark(
    kube: Kube,  # noqa: F811
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: None)  # no kopf operator runs here
    manifest = fleet_manifest(redis_url)
    manifest["spec"]["autoscaling"] = {"enabled": False}
    kube.request("POST", FLEET_PATH, body=manifest)
    ctx = OperatorContext(kube=kube)
    try:
        await reconcile(ctx, "default", FLEET, LOG)  # creates auto-replica-0 and -1
        pods = [f"{FLEET}-replica-0", f"{FLEET}-replica-1"]
        for name in pods:
            make_ready(kube, name)
        # a scale-up's new pod, marked warming by the autoscaler while it warms
        kube.annotate("Pod", "default", pods[1], {ANNOTATION_STATE: "warming"})
        await reconcile(ctx, "default", FLEET, LOG)
        assert member_states(redis_url) == {pods[0]: "ready", pods[1]: "warming"}

        # maxReplicas lowered meanwhile: the autoscaler names the warming pod, one replica fewer
        kube.annotate("PrefixCacheFleet", "default", FLEET, {ANNOTATION_VICTIMS: pods[1]})
        kube.request("PATCH", kube.path("PrefixCacheFleet", "default", FLEET, "scale"),
                     body={"spec": {"replicas": 1}}, content_type="application/merge-patch+json")  # fmt: skip
        await reconcile(ctx, "default", FLEET, LOG)  # drains it
        await reconcile(ctx, "default", FLEET, LOG)  # publishes the drain
        assert member_states(redis_url)[pods[1]] == "draining"

        await _unmark(ctx, "default", pods[1])  # its warm-up ends: prewarm_replica's finally
        await reconcile(ctx, "default", FLEET, LOG)
        # still being drained (nothing says its in-flight count: it waits out its drain time)
        assert kube.get("Pod", "default", pods[1]) is not None
        assert member_states(redis_url)[pods[1]] == "draining"  # before: "ready"
    finally:
        for client in ctx.redis_clients.values():
            await client.aclose()
        for sync_client in ctx.sync_redis_clients.values():
            sync_client.close()


def test_membership_follows_draining_since_over_the_state_annotation() -> None:
    spec = validate_spec({"model": {"name": "m"}, "engine": {"kind": "emulator"}})
    pod = ObservedPod("p", phase="Running", ready=True, pod_ip="10.0.0.1", state="ready",
                      draining_since="2026-12-02T08:00:00Z")  # fmt: skip
    assert desired_members(spec, [pod], 0.0)["p"].state == "draining"
    warming = ObservedPod("w", phase="Running", ready=True, pod_ip="10.0.0.2", state="warming")
    assert desired_members(spec, [warming], 0.0)["w"].state == "warming"
