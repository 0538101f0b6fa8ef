"""The local autoscaler checks its sidecars' answers to its state changes (real Valkey, emulators,
sidecars and a gateway).

Before, every ``POST /prefixfleet/state`` of a warm-up or drain was sent once, its answer ignored:

* a new replica's ``ready`` answered 401 (the control token rotated, ``DEL pf:{fleet}:control``,
  between the warm-up and that post) left it ``warming`` for good: every gateway skipped it while the
  planner counted it as serving capacity;
* a ``draining`` refused left the replica serving, and the drain went on to stop it under the
  requests the gateways kept sending it.

Now a 401 reads the token again and retries, a 503 or no answer is retried briefly, a failure is an
``error`` event naming the replica, the state and the answer; a drain whose ``draining`` was refused
stops nothing; and a round sets ``ready`` a replica the loop itself left ``warming`` or ``draining``
while the loop neither warms nor drains it (one a person set ``draining`` by hand stays draining).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import eventually

from prefixfleet.fleet import autoscale
from prefixfleet.fleet.autoscale import (
    STATE_POST_ATTEMPTS,
    LocalAutoscaler,
    PostStep,
    StatePosted,
    drain_goes_on,
    retry_pause_s,
    state_post_step,
    stranded,
)
from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet, Replica
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.operator.autoscale import Prewarm, ScalePlan, ScalePolicy
from prefixfleet.router.control import REREAD_INTERVAL_S, control_headers
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_load

POLICY = ScalePolicy(min_replicas=1, max_replicas=2, scale_up_cooldown_s=0, lead_time_s=0)
ENGINE = EngineSettings(cache_tokens=20_000, prefill_tokens_per_s=20_000)


@contextlib.asynccontextmanager
async def local_fleet(
    tmp_path: Path, gateways: int
) -> AsyncIterator[tuple[LocalFleet, LocalAutoscaler, aioredis.Redis, httpx.AsyncClient]]:
    """A one-replica local fleet (``gateways`` round-robin gateways), its autoscaler, clients."""
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=gateways, engine=ENGINE))
        await fleet.start_engines()
        if gateways:
            await fleet.start_gateways("round_robin")
        async with aioredis.from_url(fleet.redis_url) as redis, httpx.AsyncClient(timeout=30) as http:
            yield fleet, LocalAutoscaler(fleet, POLICY, interval_s=0.5), redis, http


async def sidecar_state(http: httpx.AsyncClient, replica: Replica) -> str:
    return str((await http.get(f"{replica.sidecar_url}/prefixfleet/status")).json()["state"])


async def published_state(redis: aioredis.Redis, fleet: LocalFleet, worker: str) -> str | None:
    """The state the gateways route by: the one in the replica's load record."""
    raw = await redis.get(FleetKeys(fleet.spec.fleet_name).load(worker))
    return decode_load(raw).state if raw is not None else None


async def control_token(redis: aioredis.Redis, fleet: LocalFleet) -> str:
    value = await redis.get(FleetKeys(fleet.spec.fleet_name).control)
    assert value is not None, "no control token in the fleet's Redis"
    return str(value.decode())


async def set_state(http: httpx.AsyncClient, redis: aioredis.Redis, fleet: LocalFleet, state: str) -> None:
    """Set the fleet's one replica ``state`` with the fleet's token, and wait until it is published."""
    (replica,) = fleet.replicas
    headers = control_headers(await control_token(redis, fleet))
    resp = await http.post(f"{replica.sidecar_url}/prefixfleet/state", json={"state": state}, headers=headers)
    assert resp.status_code == 200, resp.text
    await eventually(lambda: published_state(redis, fleet, replica.worker_id), 30, f"{state} published",
                     done=lambda published: published == state)  # fmt: skip


async def answered_by(http: httpx.AsyncClient, gateway: str) -> str:
    body = {"text": "a short question for whichever replica", "sampling_params": {"max_new_tokens": 1}}
    resp = await http.post(f"{gateway}/generate", json=body)
    assert resp.status_code == 200, resp.text
    return resp.headers.get("X-Prefixfleet-Worker", "")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_ready_refused_after_a_token_rotation_still_puts_the_new_replica_in_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_fleet(tmp_path, gateways=1) as (fleet, scaler, redis, http):
        real_warm_replica = autoscale.warm_replica

        async def rotate_then_warm(client: httpx.AsyncClient, url: str, *args: Any, **kwargs: Any) -> Any:
            # the new replica is `warming` (set with the token read for this warm-up); now the token
            # rotates, and the sidecar is waited for until it refuses the old one
            old = kwargs["control_token"]
            await redis.delete(FleetKeys(fleet.spec.fleet_name).control)

            async def hot_with_old_token() -> int:
                return (await client.get(f"{url}/prefixfleet/hot", headers=control_headers(old))).status_code

            refused = "the sidecar to refuse the old token"
            await eventually(hot_with_old_token, 30, refused, done=lambda status: status == 401)
            return await real_warm_replica(client, url, *args, **kwargs)

        monkeypatch.setattr(autoscale, "warm_replica", rotate_then_warm)
        calm = await scaler.round(redis, http)  # an idle fleet: the new replica is warmed on arrival
        assert calm.is_noop, calm
        warm = Prewarm("new-0", ("00000000c0ffee00",))
        plan = ScalePlan(desired_replicas=2, add=1, prewarm=(warm,), reason="test: scale up by 1")
        holder = fleet.replicas[0]
        await scaler.execute(plan, (), {holder.worker_id: holder.sidecar_url or ""}, http, redis)
        new = await eventually(
            lambda: next((r for r in fleet.replicas if r.worker_id == "replica-1"), None), 60, "replica-1"
        )
        await eventually(lambda: not scaler.tasks, 60, "the start and warm-up to end")
        assert await sidecar_state(http, new) == "ready", scaler.events
        gateway = fleet.gateway_urls[0]
        await eventually(
            lambda: answered_by(http, gateway), 30, "a request answered by replica-1",
            done=lambda worker: worker == "replica-1",
        )  # fmt: skip
    assert not [e for e in scaler.events if e.action == "error"], scaler.events
    assert any(e.action == "prewarm" and e.detail.startswith("replica-1:") for e in scaler.events)


async def refuse_the_held_token(
    http: httpx.AsyncClient, redis: aioredis.Redis, fleet: LocalFleet, scaler: LocalAutoscaler
) -> None:
    """Rotate the fleet's token and wait until the replica refuses the one held before; from then on
    the loop reads a token not the fleet's: its next state post is refused (401) every time."""
    (replica,) = fleet.replicas
    old = await control_token(redis, fleet)
    await redis.delete(FleetKeys(fleet.spec.fleet_name).control)

    async def hot_with_old_token() -> int:
        url = f"{replica.sidecar_url}/prefixfleet/hot"
        return (await http.get(url, headers=control_headers(old))).status_code

    await eventually(hot_with_old_token, 30, "the sidecar to refuse the old token", done=lambda s: s == 401)

    async def not_the_fleets_token(_redis: aioredis.Redis) -> str:
        return "not-the-fleets-token"

    scaler.control_token = not_the_fleets_token  # type: ignore[method-assign]


async def settle(scaler: LocalAutoscaler, redis: aioredis.Redis, http: httpx.AsyncClient) -> None:
    """One round, and the tasks it started run to their end."""
    await scaler.round(redis, http)
    await eventually(lambda: not scaler.tasks, 30, "the round's tasks to end")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_round_sets_ready_a_replica_the_loop_left_and_leaves_a_hand_drain_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autoscale, "STATE_RETRY_S", 0.01)
    async with local_fleet(tmp_path, gateways=0) as (fleet, scaler, redis, http):
        (replica,) = fleet.replicas
        name = replica.worker_id
        # drained by a person (POST /prefixfleet/state with the fleet's token), to test failover: no
        # warm-up or drain of the loop holds it, and it is not the loop's to undo
        for by_hand in ("draining", "warming"):
            await set_state(http, redis, fleet, by_hand)
            await settle(scaler, redis, http)
            assert await sidecar_state(http, replica) == by_hand, scaler.events
            assert await published_state(redis, fleet, name) == by_hand
            assert not [e for e in scaler.events if e.action == "state"], scaler.events
        await set_state(http, redis, fleet, "ready")

        # left draining by the loop: its drain set `draining`, the stop failed, and its `ready` was
        # refused (the token rotated meanwhile, the loop reads one not the fleet's)
        async def stop_fails(_replica: Replica) -> None:
            await refuse_the_held_token(http, redis, fleet, scaler)
            raise RuntimeError("the stop failed")

        monkeypatch.setattr(fleet, "stop_replica", stop_fails)
        monkeypatch.setattr(autoscale, "MIN_DRAIN_S", 0.0)
        scaler.draining.add(name)
        scaler.reserved.add(replica.index)
        with pytest.raises(RuntimeError, match="the stop failed"):
            await scaler._drain(replica, http, redis)
        assert await sidecar_state(http, replica) == "draining", scaler.events
        assert scaler.left == {name}
        del scaler.control_token  # the loop reads the fleet's token again
        await eventually(lambda: published_state(redis, fleet, name), 30, "draining published",
                         done=lambda published: published == "draining")  # fmt: skip
        await settle(scaler, redis, http)
        assert await sidecar_state(http, replica) == "ready", scaler.events
        assert scaler.events[-1].action == "state", scaler.events
        assert scaler.events[-1].detail == f"{name}: its sidecar still said draining; set ready"
        assert not scaler.left  # repaired: forgotten (a later hand drain stays)
        await set_state(http, redis, fleet, "draining")
        await settle(scaler, redis, http)
        assert await sidecar_state(http, replica) == "draining"

        # left warming by the loop (its warm-up's `ready` refused): repaired, unless it is warming it
        await set_state(http, redis, fleet, "warming")
        scaler.left.add(name)
        scaler.warming.add(name)
        await settle(scaler, redis, http)
        assert await sidecar_state(http, replica) == "warming"
        scaler.warming.discard(name)
        await settle(scaler, redis, http)
        assert await sidecar_state(http, replica) == "ready", scaler.events
        assert scaler.events[-1].detail == f"{name}: its sidecar still said warming; set ready"


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_drain_whose_draining_is_refused_stops_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autoscale, "STATE_RETRY_S", 0.01)
    async with local_fleet(tmp_path, gateways=0) as (fleet, scaler, redis, http):
        (replica,) = fleet.replicas

        async def not_the_fleets_token(_redis: aioredis.Redis) -> str:
            return "not-the-fleets-token"  # as a token read from another fleet's Redis

        scaler.control_token = not_the_fleets_token  # type: ignore[method-assign]
        scaler.draining.add(replica.worker_id)
        scaler.reserved.add(replica.index)
        await scaler._drain(replica, http, redis)
        assert fleet.replicas == [replica]  # not stopped: it never left rotation
        assert await sidecar_state(http, replica) == "ready"
        assert not scaler.draining and not scaler.reserved
    errors = [e.detail for e in scaler.events if e.action == "error"]
    assert len(errors) == 1, scaler.events
    said = f"{replica.worker_id}: state draining not set after {STATE_POST_ATTEMPTS} attempt(s): HTTP 401"
    assert errors[0].startswith(said), errors
    assert not [e for e in scaler.events if e.action in ("drain", "removed")], scaler.events


@pytest.mark.parametrize(
    ("status", "attempt", "step"),
    [
        (200, 0, PostStep.DONE),
        (204, STATE_POST_ATTEMPTS - 1, PostStep.DONE),
        (401, 0, PostStep.REREAD),
        (503, 0, PostStep.RETRY),
        (500, 1, PostStep.RETRY),
        (None, 0, PostStep.RETRY),
        (400, 0, PostStep.GIVE_UP),
        (404, 0, PostStep.GIVE_UP),
        (401, STATE_POST_ATTEMPTS - 1, PostStep.GIVE_UP),
        (503, STATE_POST_ATTEMPTS - 1, PostStep.GIVE_UP),
        (None, STATE_POST_ATTEMPTS - 1, PostStep.GIVE_UP),
    ],
)
def test_state_post_step(status: int | None, attempt: int, step: PostStep) -> None:
    assert state_post_step(status, attempt) is step


def test_a_token_unchanged_on_rereading_waits_for_the_sidecars_next_read() -> None:
    assert retry_pause_s(PostStep.REREAD, 0, token_changed=True) == 0.0
    assert retry_pause_s(PostStep.REREAD, 0, token_changed=False) >= REREAD_INTERVAL_S
    assert 0 < retry_pause_s(PostStep.RETRY, 0, token_changed=False) < retry_pause_s(PostStep.RETRY, 1, False)


def test_stranded_names_only_present_replicas_the_loop_does_not_hold() -> None:
    states = {"r0": "warming", "r1": "draining", "r2": "ready", "r3": "warming", "r4": "draining"}
    states["r5"] = "warming"
    present = {"r0", "r1", "r2", "r3", "r4"}  # r5 left the fleet
    left = {"r0", "r1", "r3", "r4", "r5"}
    assert stranded(states, left, warming={"r3"}, draining={"r4"}, present=present) == ["r0", "r1"]
    # a state the loop did not leave (a person drained r1 by hand) is not the loop's to undo
    by_hand = stranded(states, left - {"r1"}, warming=set(), draining=set(), present=present)
    assert by_hand == ["r0", "r3", "r4"]


@pytest.mark.parametrize(
    ("ok", "status", "goes_on"),
    [(True, 200, True), (False, None, True), (False, 401, False), (False, 503, False)],
)
def test_a_drain_goes_on_unless_its_sidecar_answered_a_refusal(
    ok: bool, status: int | None, goes_on: bool
) -> None:
    assert drain_goes_on(StatePosted(ok, "t", status, "")) is goes_on


async def test_a_replica_whose_sidecar_already_says_ready_is_not_set_again(tmp_path: Path) -> None:
    # its load record may lag a `ready` that got through: the sidecar's status is asked first
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        return httpx.Response(200, json={"state": "ready", "load": {}})

    scaler = LocalAutoscaler(None, POLICY)  # type: ignore[arg-type]
    scaler.restoring.add("replica-0")
    no_redis = aioredis.from_url(f"unix://{tmp_path}/no-redis.sock")  # a post would read the token
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        await scaler._restore("replica-0", "warming", "http://sidecar", http, no_redis)
    await no_redis.aclose()
    assert asked == ["GET /prefixfleet/status"] and not scaler.events and not scaler.restoring
