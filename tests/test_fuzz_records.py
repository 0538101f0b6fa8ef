"""Malformed data from Redis and invalid PrefixCacheFleet specs (property-based, pure).

Specification:
* a summary whose JSON header has any field of any wrong type or value, or whose bytes were flipped
  or cut anywhere, decodes to a valid Summary or raises SummaryError — nothing else;
* member and load records of arbitrary JSON (or bytes) raise only SummaryError;
* a gateway's FleetView fed arbitrary members, loads and summaries never raises: the bad ones come
  back as warnings naming the worker, the good ones are used;
* validate_spec on arbitrary (and almost-valid) specs raises only InvalidFleetSpec, and every
  problem line names the field it is about (``spec.<path>``).
"""

from __future__ import annotations

import contextlib
import json
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.operator.models import InvalidFleetSpec, validate_spec
from prefixfleet.router.records import LoadReport, MemberRecord, decode_load, decode_member, encode_record
from prefixfleet.router.summary import HotNode, Summary, SummaryError, decode_summary, encode_summary
from prefixfleet.router.view import FleetView

pytestmark = pytest.mark.slow

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


def valid_summary(worker: str = "w0") -> Summary:
    return Summary(
        worker=worker,
        version=3,
        generated_at=1764489612.0,
        block_tokens=16,
        identity_seed=0x9AE16A3B2F90404F,
        cached_tokens=48,
        capacity_tokens=1000,
        blocks=array("Q", [1, 5, 9]),
        hot=(HotNode(5, 32, 4, 1764489611.0),),
    )


def with_header(raw: bytes, header: dict) -> bytes:
    """Re-pack ``raw`` (an encoded summary) with another JSON header, keeping its hash array."""
    head_len = struct.unpack_from("<I", raw, 4)[0]
    body = raw[8 + head_len :]
    new = json.dumps(header).encode()
    return raw[:4] + struct.pack("<I", len(new)) + new + body


def decodes_or_refuses(data: bytes) -> None:
    try:
        summary = decode_summary(data)
    except SummaryError as exc:
        assert str(exc)
        return
    assert isinstance(summary, Summary)
    assert list(summary.blocks) == sorted(set(summary.blocks))


HEADER_FIELDS = [
    "worker", "version", "generated_at", "block_tokens", "identity_seed", "cached_tokens",
    "capacity_tokens", "num_blocks", "truncated", "hot",
]  # fmt: skip


@settings(max_examples=300)
@given(field=st.sampled_from(HEADER_FIELDS), value=json_values, drop=st.booleans())
def test_a_summary_header_with_any_wrong_field_is_refused_with_summary_error_only(field, value, drop):
    raw = encode_summary(valid_summary())
    header = json.loads(raw[8 : 8 + struct.unpack_from("<I", raw, 4)[0]])
    if drop:
        header.pop(field)
    else:
        header[field] = value
    decodes_or_refuses(with_header(raw, header))


@settings(max_examples=100)
@given(hot=st.lists(st.dictionaries(st.sampled_from(["h", "tokens", "hits", "last_access"]), json_values)))
def test_malformed_hot_nodes_are_refused_with_summary_error_only(hot):
    raw = encode_summary(valid_summary())
    header = json.loads(raw[8 : 8 + struct.unpack_from("<I", raw, 4)[0]])
    header["hot"] = hot
    decodes_or_refuses(with_header(raw, header))


@settings(max_examples=300)
@given(data=st.data())
def test_a_summary_with_flipped_or_missing_bytes_decodes_or_is_refused(data):
    raw = bytearray(encode_summary(valid_summary()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    decodes_or_refuses(bytes(raw[:cut]))


@given(value=json_values)
def test_member_and_load_records_of_any_json_raise_only_summary_error(value):
    for decode in (decode_member, decode_load):
        for raw in (json.dumps(value), json.dumps(value).encode(), b"\xff" + json.dumps(value).encode()):
            with contextlib.suppress(SummaryError):
                decode(raw)


good_member = encode_record(MemberRecord(url="http://127.0.0.1:9", model="m", revision="r"))
good_load = encode_record(LoadReport(1, 1.0, "ready", True, 0, 0, 0, 1000.0, 0, 100, 3))
raw_records = (
    st.just(good_member)
    | st.just(good_load)
    | json_values.map(json.dumps)
    | st.binary(max_size=60)
    | st.dictionaries(
        st.sampled_from(["url", "state", "v", "seq", "ts", "engine_ok", "in_flight"]), json_values
    ).map(json.dumps)
)


@settings(max_examples=200)
@given(
    members=st.dictionaries(st.sampled_from(["w0", "w1", "w2"]), raw_records, max_size=3),
    loads=st.dictionaries(st.sampled_from(["w0", "w1", "w2"]), raw_records | st.none(), max_size=3),
    summaries=st.dictionaries(
        st.sampled_from(["w0", "w1", "w2"]),
        st.binary(max_size=80)
        | st.sampled_from([encode_summary(valid_summary(w)) for w in ("w0", "w1", "w9")]),
        max_size=3,
    ),
)
def test_a_gateway_view_fed_any_records_never_raises_and_warns_per_bad_record(members, loads, summaries):
    view = FleetView()
    result = view.apply_snapshot(members, loads, now=1.0)
    assert all(isinstance(w, str) and w.startswith("ignoring") for w in result.warnings)
    for wid, raw in summaries.items():
        warning = view.apply_summary(wid, raw)
        assert warning is None or warning.startswith("ignoring")
    view.routable(1.0)
    hashes = view.request_hashes(b"\x01\x00\x00\x00" * 40, None, view.workers.values())
    view.replica_states(list(view.workers.values()), hashes, 40, 1.0)


# -- PrefixCacheFleet specs ----------------------------------------------------------------------------

SPEC_FIELDS = {
    "model": st.fixed_dictionaries(
        {}, optional={"name": json_values | st.just("meta-llama/Llama-3-8B"), "revision": json_values}
    ),
    "engine": st.fixed_dictionaries(
        {},
        optional={
            "kind": st.sampled_from(["emulator", "sglang", "vllm", "tgi"]) | json_values,
            "image": json_values,
            "port": st.integers(-5, 70000) | json_values,
            "args": json_values,
            "env": st.lists(st.fixed_dictionaries({}, optional={"name": json_values, "value": json_values})),
            "podTemplate": json_values,
        },
    ),
    "replicas": st.integers(-3, 10**6) | json_values,
    "autoscaling": st.fixed_dictionaries(
        {},
        optional={
            "enabled": json_values,
            "minReplicas": st.integers(-3, 50) | json_values,
            "maxReplicas": st.integers(-3, 50) | json_values,
        },
    ),
    "router": st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(["queue_aware", "round_robin", "nope"]) | json_values,
            "replicas": json_values,
            "blockTokens": st.integers(-2, 10**9) | json_values,
        },
    ),
    "redis": st.fixed_dictionaries(
        {},
        optional={
            "url": st.sampled_from(["redis://r:6379/0", "http://r", ""]) | json_values,
            "secretRef": st.fixed_dictionaries({}, optional={"name": json_values, "key": json_values}),
            "passwordSecretRef": json_values,
            "tls": json_values,
        },
    ),
    "bogus": json_values,
}


@settings(max_examples=400)
@given(spec=st.fixed_dictionaries({}, optional=SPEC_FIELDS) | json_values)
def test_validate_spec_raises_only_invalid_fleet_spec_and_names_the_field(spec):
    try:
        validate_spec(spec)
    except InvalidFleetSpec as exc:
        assert exc.problems
        for line in exc.problems:
            assert line.startswith("spec"), line
