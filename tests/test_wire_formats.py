"""The router's wire formats, pinned byte for byte: gateways and sidecars of different versions meet
in one fleet during a rolling update, so what an older release wrote must still decode the same.

Specification:
* integer arrays on the wire are little-endian whatever the host: token ids as u32 (radix edges),
  block hashes as u64 (summaries, send notices); packing never modifies the caller's array;
* a send notice and a summary encode to exactly the bytes of the literal examples below (written
  by the release before the shared little-endian codec);
* a loads-channel message is ``<worker>\\n<load JSON>``: it round-trips, the literal example an
  older sidecar published decodes to the same report (also without ``fixed_latency_s``, which
  older sidecars did not send), and a malformed message raises a ValueError naming what is wrong;
* a real gateway subscribed to the loads channel logs a malformed message and skips it, and keeps
  adopting the well-formed pushes that follow;
* ids and names (worker, gateway, fleet, a warm request's source URL) must match their pattern as a
  whole string: a trailing newline is refused, not ignored;
* every decimal a record, push, notice or summary carries (times, rates, latencies) is finite: NaN,
  Infinity and numbers beyond a float (``1e400``, a 400-digit integer) are refused with an error
  naming the field, and an integer wider than 64 bits is refused the same way;
* decoding a summary copies its block hashes once, into the returned array, whatever buffer holds it.
"""

from __future__ import annotations

import json
import logging
import struct
import tracemalloc
from array import array
from collections.abc import Iterable, Sequence

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from fleet_fixtures import RedisServer, eventually

from prefixfleet.router.gateway import Gateway, GatewayConfig
from prefixfleet.router.keys import FleetKeys, validate_fleet_name
from prefixfleet.router.little_endian import pack_le, unpack_le
from prefixfleet.router.prewarm import parse_warm_request
from prefixfleet.router.radix import as_token_bytes, decode_tokens
from prefixfleet.router.records import (
    LoadPush,
    LoadReport,
    MemberRecord,
    SummaryError,
    decode_load_push,
    decode_member,
    decode_send,
    encode_load_push,
    encode_record,
    encode_send,
    validate_worker_id,
)
from prefixfleet.router.summary import HotNode, Summary, decode_summary, encode_summary, make_summary

REPORT = LoadReport(7, 1764489612.25, "ready", True, 2, 1, 300, 12000.0, 4096, 65536, 3, 0.125)
# what a sidecar published on the loads channel for REPORT before the codec existed
OLD_LOAD_PUSH = (
    'w-1\n{"seq":7,"ts":1764489612.25,"state":"ready","engine_ok":true,"in_flight":2,"queued":1,'
    '"pending_prefill_tokens":300,"prefill_tokens_per_s":12000.0,"cached_tokens":4096,'
    '"capacity_tokens":65536,"summary_version":3,"fixed_latency_s":0.125,"v":1}'
)


def test_token_ids_are_little_endian_u32() -> None:
    tokens = array("I", [1, 0x01020304, 2**32 - 1])
    raw = as_token_bytes(tokens)
    assert raw == b"\x01\x00\x00\x00\x04\x03\x02\x01\xff\xff\xff\xff"
    assert as_token_bytes(list(tokens)) == raw
    assert decode_tokens(raw) == [1, 0x01020304, 2**32 - 1]
    assert list(tokens) == [1, 0x01020304, 2**32 - 1]  # the caller's array is left as it was


def test_block_hashes_are_little_endian_u64() -> None:
    hashes = array("Q", [1, 0x0102030405060708])
    raw = pack_le(hashes)
    assert raw == b"\x01" + b"\x00" * 7 + b"\x08\x07\x06\x05\x04\x03\x02\x01"
    assert list(hashes) == [1, 0x0102030405060708]
    back = unpack_le("Q", raw)
    assert (back.typecode, list(back)) == ("Q", [1, 0x0102030405060708])
    assert list(unpack_le("Q", memoryview(raw)[8:])) == [0x0102030405060708]
    with pytest.raises(ValueError):
        unpack_le("Q", raw[:-1])


def test_send_notice_bytes_are_pinned() -> None:
    raw = encode_send("gw-a", "replica-0", 1234.5, [1, 0x0102030405060708])
    assert raw == (
        b"PFX1gw-a\nreplica-0\n1234.5\n\x01\x00\x00\x00\x00\x00\x00\x00\x08\x07\x06\x05\x04\x03\x02\x01"
    )
    notice = decode_send(raw)
    assert (notice.worker, notice.hashes.typecode, list(notice.hashes)) == (
        "replica-0",
        "Q",
        [1, 0x0102030405060708],
    )


def _pinned_summary(blocks: Iterable[int], hot: Sequence[HotNode] = ()) -> Summary:
    return make_summary(
        worker="w0",
        version=3,
        generated_at=1764489612.0,
        block_tokens=16,
        identity_seed=0x9AE16A3B2F90404F,
        cached_tokens=32,
        capacity_tokens=1000,
        blocks=blocks,
        hot=hot,
    )


def test_summary_bytes_are_pinned() -> None:
    summary = _pinned_summary([0x0102030405060708, 1])
    raw = encode_summary(summary)
    assert raw == (
        b'PFS\x01\xc0\x00\x00\x00{"worker":"w0","version":3,"generated_at":1764489612.0,'
        b'"block_tokens":16,"identity_seed":"9ae16a3b2f90404f","cached_tokens":32,'
        b'"capacity_tokens":1000,"num_blocks":2,"truncated":false,"hot":[]}'
        b"\x01\x00\x00\x00\x00\x00\x00\x00\x08\x07\x06\x05\x04\x03\x02\x01"
    )
    assert decode_summary(raw) == summary
    assert list(decode_summary(raw).blocks) == [1, 0x0102030405060708]


def test_load_push_round_trips_and_keeps_the_older_wire_format() -> None:
    raw = encode_load_push("w-1", encode_record(REPORT))
    assert raw == OLD_LOAD_PUSH
    assert decode_load_push(raw) == LoadPush("w-1", REPORT)
    assert decode_load_push(OLD_LOAD_PUSH.encode()) == LoadPush("w-1", REPORT)  # as Redis delivers it
    without_fixed = OLD_LOAD_PUSH.replace(',"fixed_latency_s":0.125', "")  # an older sidecar's push
    assert decode_load_push(without_fixed).load.fixed_latency_s == 0.0


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"w-1 no newline", "no newline"),
        (b"bad id!\n" + OLD_LOAD_PUSH.split("\n", 1)[1].encode(), "bad worker id"),
        (b"w\xc3\xa9\n{}", "bad worker id"),
        (b"w-1\nnot json", "'w-1'.*not JSON"),
        (b"w-1\n" + b"[" * 100_000, "nested too deeply"),
        (b"w-1\n\xff\xfe", "not JSON"),
        (b'w-1\n{"v":1}', "field 'state'"),
        (OLD_LOAD_PUSH.replace('"v":1', '"v":2'), "record version"),
        (OLD_LOAD_PUSH.replace('"in_flight":2', '"in_flight":-2'), "in_flight.*negative"),
        (42, "bytes or str"),
    ],
)
def test_malformed_load_pushes_are_refused_with_a_reason(message: object, reason: str) -> None:
    with pytest.raises(SummaryError, match=reason) as caught:
        decode_load_push(message)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)


def test_a_load_push_needs_a_valid_worker_id() -> None:
    with pytest.raises(ValueError, match="worker id"):
        encode_load_push("bad id!", encode_record(REPORT))


@pytest.mark.timeout(60)
async def test_gateway_logs_and_skips_malformed_load_pushes(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = "wireformats"
    keys = FleetKeys(fleet)
    client = aioredis.from_url(redis_server.url)
    polled = LoadReport(1, 1764489612.0, "ready", True, 0, 0, 0, 12000.0, 0, 65536, 0)
    await client.hset(keys.members, "w0", encode_record(MemberRecord(url="http://127.0.0.1:9")))
    await client.set(keys.load("w0"), encode_record(polled))
    # One refresh at start-up, then none for the test: whatever changes later arrived by push.
    gateway = Gateway(GatewayConfig(port=0, redis_url=redis_server.url, fleet=fleet, refresh_interval_s=3600))
    runner = web.AppRunner(gateway.app(), handle_signals=False)
    await runner.setup()
    try:
        assert gateway.view.workers["w0"].load == polled

        async def loads_listeners() -> int:  # the gateway subscribes in its own task
            return dict(await client.pubsub_numsub(keys.loads)).get(keys.loads.encode(), 0)

        await eventually(loads_listeners, 30, "the gateway to subscribe to the loads channel")
        pushed = LoadReport(2, 1764489613.0, "ready", True, 5, 3, 900, 12000.0, 0, 65536, 0)
        with caplog.at_level(logging.WARNING, logger="prefixfleet.gateway"):
            pushed_json = encode_record(pushed)
            overflowing = pushed_json.replace('"ts":', f'"ts":{BEYOND_A_FLOAT},"x":')  # ended the loop
            not_a_number = pushed_json.replace('"ts":', '"ts":NaN,"x":')  # adopted, poisoning arithmetic
            for bad in [
                b"no newline",
                b"w0\n" + b"[" * 100_000,
                b"w0\n{}",
                b"bad id!\n{}",
                f"w0\n{overflowing}",
                f"w0\n{not_a_number}",
            ]:
                await client.publish(keys.loads, bad)
            await client.publish(keys.loads, encode_load_push("w0", encode_record(pushed)))
            # a channel delivers in order, so the bad ones came first
            await eventually(
                lambda: gateway.view.workers["w0"].load, 30, "the gateway to adopt the well-formed push",
                done=lambda load: load == pushed,
            )  # fmt: skip
        warnings = [r.getMessage() for r in caplog.records if r.name == "prefixfleet.gateway"]
        for reason in [
            "no newline",
            "nested too deeply",
            "'w0': load record: unsupported",
            "bad worker id",
            "field 'ts' is larger than",
            "field 'ts' must be a finite number, got nan",
        ]:
            assert any(
                w.startswith("ignoring a malformed message on the loads channel") and reason in w
                for w in warnings
            ), (reason, warnings)
    finally:
        await client.aclose()
        await runner.cleanup()


@pytest.mark.parametrize(
    "refuse",
    [
        lambda: validate_worker_id("w1\n"),
        lambda: encode_load_push("w1\n", encode_record(REPORT)),
        lambda: encode_send("gw-a\n", "w1", 1.0, [1]),
        lambda: encode_send("gw-a", "w1\n", 1.0, [1]),
        lambda: validate_fleet_name("default\n"),
        lambda: FleetKeys("default\n"),
        lambda: parse_warm_request({"source": "http://127.0.0.1:8000\n", "hashes": []}),
    ],
    ids=["worker", "load-push-worker", "send-gateway", "send-worker", "fleet", "fleet-keys", "warm-source"],
)
def test_a_trailing_newline_makes_an_id_or_name_invalid(refuse) -> None:
    with pytest.raises(ValueError):
        refuse()


def test_ids_and_names_without_a_newline_stay_valid() -> None:
    assert validate_worker_id("replica-0.pod:8000") == "replica-0.pod:8000"
    assert validate_fleet_name("default") == "default"
    assert parse_warm_request({"source": "http://127.0.0.1:8000/", "hashes": []}).source == (
        "http://127.0.0.1:8000"
    )


BEYOND_A_FLOAT = "1" + "0" * 400  # an integer literal float() cannot convert (OverflowError)


@pytest.mark.parametrize("field", ["ts", "prefill_tokens_per_s", "fixed_latency_s"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e400", pytest.param(BEYOND_A_FLOAT, id="10**400")])
def test_a_load_push_with_a_non_finite_decimal_is_refused_naming_the_field(field: str, literal: str) -> None:
    obj = json.loads(OLD_LOAD_PUSH.split("\n", 1)[1])
    body = json.dumps(obj | {field: "@"}).replace('"@"', literal)
    with pytest.raises(SummaryError, match=f"load record: field '{field}'"):
        decode_load_push("w-1\n" + body)


@pytest.mark.parametrize("field", ["ts", "prefill_tokens_per_s"])
def test_minus_infinity_in_a_load_record_is_refused_naming_the_field(field: str) -> None:
    body = encode_record(REPORT).replace(f'"{field}":', f'"{field}":-Infinity,"x":')
    with pytest.raises(SummaryError, match=f"field '{field}'"):
        decode_load_push("w-1\n" + body)


@pytest.mark.parametrize("field", ["seq", "in_flight", "pending_prefill_tokens", "capacity_tokens"])
def test_a_load_record_integer_wider_than_64_bits_is_refused_naming_the_field(field: str) -> None:
    obj = json.loads(encode_record(REPORT)) | {field: 2**64}
    with pytest.raises(SummaryError, match=f"field '{field}'"):
        decode_load_push("w-1\n" + json.dumps(obj))


def test_a_load_record_with_an_integer_of_thousands_of_digits_is_refused() -> None:
    body = encode_record(REPORT).replace('"seq":7', '"seq":' + "7" * 5000)  # past int()'s digit limit
    with pytest.raises(SummaryError, match="load record"):
        decode_load_push("w-1\n" + body)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"registered_at": "NaN"}, "registered_at"),
        ({"registered_at": BEYOND_A_FLOAT}, "registered_at"),
        ({"block_tokens": "0"}, "block_tokens"),
        ({"block_tokens": str(2**64)}, "block_tokens"),
    ],
    ids=["registered_at-NaN", "registered_at-10**400", "block_tokens-0", "block_tokens-2**64"],
)
def test_a_member_record_with_a_poisonous_number_is_refused_naming_the_field(change, field) -> None:
    obj = json.loads(encode_record(MemberRecord(url="http://127.0.0.1:9"))) | dict.fromkeys(change, "@")
    body = json.dumps(obj).replace('"@"', next(iter(change.values())))
    with pytest.raises(SummaryError, match=f"member record: field '{field}'"):
        decode_member(body)


@pytest.mark.parametrize("time", [b"nan", b"inf", b"-inf", b"1e400", b"-1"])
def test_a_send_notice_time_must_be_finite_and_non_negative(time: bytes) -> None:
    raw = encode_send("gw-a", "w1", 1234.5, [1]).replace(b"1234.5", time)
    with pytest.raises(SummaryError, match="time must be a finite non-negative number"):
        decode_send(raw)


def _summary_bytes(blocks: int = 2) -> bytes:
    return encode_summary(_pinned_summary(range(1, blocks + 1), [HotNode(1, 16, 2, 1764489611.0)]))


def _with_header(raw: bytes, edit) -> bytes:
    """``raw`` re-packed with its JSON header text passed through ``edit``."""
    head_len = struct.unpack_from("<I", raw, 4)[0]
    header = edit(raw[8 : 8 + head_len].decode()).encode()
    return raw[:4] + struct.pack("<I", len(header)) + header + raw[8 + head_len :]


@pytest.mark.parametrize("field", ["generated_at", "last_access"])
@pytest.mark.parametrize(
    "literal", ["NaN", "Infinity", "-Infinity", "1e400", pytest.param(BEYOND_A_FLOAT, id="10**400")]
)
def test_a_summary_time_that_is_not_finite_is_refused_naming_the_field(field: str, literal: str) -> None:
    raw = _with_header(
        _summary_bytes(), lambda h: h.replace(f'"{field}":1764489', f'"{field}":{literal},"x":1')
    )
    with pytest.raises(SummaryError, match=f"field '{field}'"):
        decode_summary(raw)


@pytest.mark.parametrize("field", ["version", "cached_tokens", "capacity_tokens", "block_tokens"])
def test_a_summary_integer_wider_than_64_bits_is_refused_naming_the_field(field: str) -> None:
    raw = _with_header(_summary_bytes(), lambda h: h.replace(f'"{field}":', f'"{field}":{2**64},"x":'))
    with pytest.raises(SummaryError, match=f"field '{field}'"):
        decode_summary(raw)


@pytest.mark.parametrize(
    ("header", "reason"),
    [("[" * 100_000, "nested too deeply"), ('{"version":' + "7" * 5000 + "}", "not JSON")],
)
def test_an_unreadable_summary_header_is_refused_with_summary_error(header: str, reason: str) -> None:
    raw = _with_header(_summary_bytes(), lambda _: header)
    with pytest.raises(SummaryError, match=reason):
        decode_summary(raw)


def test_decoding_a_summary_copies_its_block_hashes_once() -> None:
    raw = _summary_bytes(blocks=32768)  # the default cap: 256 KiB of hashes
    hashes_bytes = 8 * 32768
    for buffer in (raw, bytearray(raw), memoryview(raw), memoryview(bytearray(raw))):
        tracemalloc.start()
        try:
            summary = decode_summary(buffer)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert list(summary.blocks) == list(range(1, 32769))
        assert encode_summary(summary) == raw  # byte-identical round trip
        # the returned array is the one copy; a second (a slice, a bytes()) would double the peak
        assert hashes_bytes <= peak < 1.5 * hashes_bytes, (type(buffer).__name__, peak)
    buffer = bytearray(raw)
    decode_summary(buffer)
    buffer.extend(b"x")  # the decoder let go of the buffer (a held view would forbid resizing)
