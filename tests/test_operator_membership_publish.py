"""The operator's membership write, against a real Redis-compatible server: the members hash and
the change notices on the events channel, in the same words the sidecar and the reaper use."""

from __future__ import annotations

import logging

import redis
from fleet_fixtures import RedisServer, redis_server  # noqa: F401  (pytest fixture)

from prefixfleet.operator.handlers import OperatorContext, ReconcileOutcome, publish_membership
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedPod
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_member

SPEC = FleetSpec.model_validate({"model": {"name": "m", "revision": "r1"}, "engine": {"kind": "emulator"}})
REF = FleetRef(name="demo", namespace="team-a", uid="u1")


def pod(name: str) -> ObservedPod:
    return ObservedPod(name=name, phase="Running", ready=True, pod_ip="10.0.0.7")


def notices(pubsub: redis.client.PubSub) -> list[bytes]:
    out = []
    while (message := pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)) is not None:
        out.append(message["data"])
    return out


async def test_joined_and_left_are_announced_as_the_sidecar_announces_them(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    keys = FleetKeys(REF.redis_fleet)
    watcher = redis_server.client().pubsub()
    watcher.subscribe(keys.events)
    assert watcher.get_message(timeout=5.0) is not None  # the subscribe confirmation
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]  # membership never calls the API server
    log = logging.getLogger("test")
    try:
        await publish_membership(ctx, ReconcileOutcome({}, spec=SPEC, ref=REF, pods=(pod("a"), pod("b")),
                                                       redis_url=redis_server.url), log)  # fmt: skip
        members = redis_server.client().hgetall(keys.members)
        assert sorted(members) == [b"a", b"b"]
        assert decode_member(members[b"a"]).url == "http://10.0.0.7:8100"
        assert sorted(notices(watcher)) == [b"joined a", b"joined b"]
        # "b" is gone: its entry is removed and "left b" announced, the word the sidecar and the
        # local fleet's reaper publish (router/keys.deregister_worker)
        await publish_membership(ctx, ReconcileOutcome({}, spec=SPEC, ref=REF, pods=(pod("a"),),
                                                       redis_url=redis_server.url), log)  # fmt: skip
        assert sorted(redis_server.client().hgetall(keys.members)) == [b"a"]
        assert notices(watcher) == [b"left b"]
        # nothing changed: nothing written, nothing announced
        await publish_membership(ctx, ReconcileOutcome({}, spec=SPEC, ref=REF, pods=(pod("a"),),
                                                       redis_url=redis_server.url), log)  # fmt: skip
        assert notices(watcher) == []
    finally:
        watcher.close()
        for client in ctx.redis_clients.values():
            await client.aclose()
