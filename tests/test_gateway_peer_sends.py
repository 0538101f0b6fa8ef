"""Gateways tell each other what they routed, so a prefix is matched fleet-wide before any summary.

Specification:
* a send notice names the gateway, the worker, the send time and the request's hash chain; it
  round-trips through its wire format and malformed notices are refused with a reason;
* a peer's send counts as cached on its worker exactly like an own send: until a summary generated
  well after it shows the prefix gone;
* a real gateway publishes each routed request on the fleet's sends channel, and another gateway
  adds the notices of its peers (never its own) to its view.
"""

from __future__ import annotations

import time

import aiohttp
import pytest
import redis.asyncio as aioredis
from fleet_fixtures import RedisServer, Spawner, eventually
from test_dataplane_services import FLEET, post, start_fleet, view_of, words

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import (
    LoadReport,
    MemberRecord,
    SummaryError,
    decode_send,
    encode_record,
    encode_send,
)
from prefixfleet.router.summary import encode_summary, make_summary
from prefixfleet.router.view import FleetView

B = 16
SEED = CacheIdentity("m", "r").seed()


def test_send_notices_round_trip_and_malformed_ones_are_refused() -> None:
    raw = encode_send("gw-a", "replica-0", 1234.5, [1, 2**64 - 1])
    notice = decode_send(raw)
    assert (notice.gateway, notice.worker, notice.sent_at, list(notice.hashes)) == (
        "gw-a",
        "replica-0",
        1234.5,
        [1, 2**64 - 1],
    )
    for bad, reason in [
        (b"XXXX" + raw[4:], "magic"),
        (raw[:-3], "multiple of 8"),
        (raw.replace(b"1234.5", b"nan"), "finite"),
        (raw.replace(b"replica-0", b"bad id!"), "bad gateway or worker"),
        (b"PFX1only-one-line", "header"),
    ]:
        with pytest.raises(SummaryError, match=reason):
            decode_send(bad)
    with pytest.raises(ValueError, match="gateway id"):
        encode_send("has\nnewline", "replica-0", 1.0, [])


def _view() -> FleetView:
    view = FleetView(block_tokens=B, default_identity=CacheIdentity("m", "r"))
    member = encode_record(MemberRecord(url="http://127.0.0.1:9", model="m", revision="r", block_tokens=B))
    load = encode_record(LoadReport(1, 0.0, "ready", True, 0, 0, 0, 1000.0, 0, 100, 0))
    view.apply_snapshot({"w1": member, "w2": member}, {"w1": load, "w2": load}, now=0.0)
    return view


def test_a_peers_send_counts_as_cached_until_a_later_summary_shows_it_gone() -> None:
    view = _view()
    w1 = view.workers["w1"]
    chain = view.request_hashes(as_token_bytes(list(range(40))), None, [w1])[(SEED, B)]
    view.record_peer_send("w1", chain, sent_at=1000.0)
    rows = {
        r.replica_id: r
        for r in view.replica_states(list(view.workers.values()), {(SEED, B): chain}, 40, 1000.2)
    }
    assert (rows["w1"].matched_tokens, rows["w2"].matched_tokens) == (32, 0)
    assert rows["w1"].in_flight == 0  # a peer's load reaches us through the sidecar's load records
    empty = make_summary(
        worker="w1",
        version=2,
        generated_at=1005.0,
        block_tokens=B,
        identity_seed=SEED,
        cached_tokens=0,
        capacity_tokens=100,
        blocks=[],
    )
    assert view.apply_summary("w1", encode_summary(empty)) is None
    assert view.matched_tokens(w1, chain, B, wall_now=1006.0) == 0
    view.record_peer_send("nobody", chain, sent_at=1000.0)  # a worker we do not know: ignored


@pytest.mark.timeout(120)
async def test_gateways_publish_their_sends_and_count_their_peers(spawn: Spawner, redis_server: RedisServer):
    fleet = start_fleet(spawn, redis_server)
    gw_a, gw_b = fleet.gateway_urls
    keys = FleetKeys(FLEET)
    client = aioredis.from_url(redis_server.url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(keys.sends)

        async def sends_listeners() -> int:
            return dict(await client.pubsub_numsub(keys.sends)).get(keys.sends.encode(), 0)

        # both gateways subscribe to the sends channel in a task of their own, not before they route:
        # B must be listening for the notices below to reach its view (and A then has a peer)
        await eventually(
            sends_listeners, 30, "both gateways and the test to listen on the sends channel",
            done=lambda n: n >= 3,
        )  # fmt: skip
        async with aiohttp.ClientSession() as http:
            status, _, headers = await post(
                http,
                f"{gw_a}/generate",
                {"text": words("peer", 200), "sampling_params": {"max_new_tokens": 1}},
            )
            assert status == 200
            holder = headers["X-Prefixfleet-Worker"]
            notice = None
            for _ in range(100):  # bounded: the notice is published right after the send
                message = await pubsub.get_message(timeout=0.1)
                if message is not None:
                    notice = decode_send(message["data"])
                    break
            assert notice is not None and notice.worker == holder and len(notice.hashes) == 200 // B
            # A notice from a third gateway reaches gateway B's view. (Sent "in the future" so that
            # no summary prunes it before we look: this checks the plumbing, not the timing.)
            other = "w1" if holder == "w0" else "w0"
            before = (await view_of(http, gw_b))[other]["overlay_blocks"]
            fake = encode_send("peer-test", other, time.time() + 60, list(range(1, 8)))
            await client.publish(keys.sends, fake)
            await eventually(
                lambda: view_of(http, gw_b), 30, "gateway B to count the peer's send",
                done=lambda view: view[other]["overlay_blocks"] >= before + 7,
            )  # fmt: skip
    finally:
        await pubsub.aclose()
        await client.aclose()
