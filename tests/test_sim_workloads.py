"""Workloads: deterministic by seed, with exactly the prefix structure each one describes."""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from prefixfleet.router.radix import TOKEN_BYTES, as_token_bytes
from prefixfleet.sim.workloads import WORKLOADS, build_workload, lab_burst_token_lists

MOONCAKE = Path(__file__).resolve().parents[1] / "traces" / "mooncake_synthetic_trace.jsonl"


def shared_tokens(a: bytes, b: bytes) -> int:
    n = 0
    limit = min(len(a), len(b)) // TOKEN_BYTES
    while (
        n < limit and a[n * TOKEN_BYTES : (n + 1) * TOKEN_BYTES] == b[n * TOKEN_BYTES : (n + 1) * TOKEN_BYTES]
    ):
        n += 1
    return n


@pytest.mark.parametrize("name", ["prefixroute", "gsp", "chat", "viral"])
def test_generated_workloads_are_deterministic_by_seed(name: str) -> None:
    a = build_workload(name, seed=7)
    b = build_workload(name, seed=7)
    c = build_workload(name, seed=8)
    assert a.requests == b.requests
    assert a.requests != c.requests
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a.requests, a.requests[1:], strict=False))


def test_prefixroute_has_12_zipf_tenants_sharing_exactly_their_prefix() -> None:
    wl = build_workload("prefixroute")
    assert len(wl.requests) == 4000
    by_tenant = defaultdict(list)
    for r in wl.requests:
        by_tenant[r.group].append(r)
    assert len(by_tenant) == 12
    counts = sorted((len(v) for v in by_tenant.values()), reverse=True)
    assert counts[0] > 3 * counts[-1]  # skewed popularity
    s = wl.settings
    for reqs in by_tenant.values():
        prefix = shared_tokens(reqs[0].tokens, reqs[1].tokens)
        assert s["prefix_tokens_min"] <= prefix <= s["prefix_tokens_max"]
        turn = reqs[0].num_tokens - prefix
        assert s["turn_tokens_min"] <= turn <= s["turn_tokens_max"]
    tenants = list(by_tenant.values())
    assert shared_tokens(tenants[0][0].tokens, tenants[1][0].tokens) == 0
    # the working set of tenant prefixes exceeds one replica's cache at the acceptance settings
    assert 12 * s["prefix_tokens_min"] > wl.recommended["cache_tokens"]


def test_lab_burst_is_the_labs_32_prompts_14_ms_apart() -> None:
    wl = build_workload("lab-burst", seed=3)
    assert [list(memoryview(r.tokens).cast("I")) for r in wl.requests] == lab_burst_token_lists()
    assert [r.arrival_s for r in wl.requests] == [i * 0.014 for i in range(32)]
    assert [r.group for r in wl.requests[:5]] == ["tenant1", "tenant0", "tenant3", "tenant2", "tenant1"]
    assert {r.group for r in wl.requests[16:]} == {"tenant0"}
    assert {r.num_tokens for r in wl.requests} == {4096 + 256}


def test_gsp_is_64_groups_of_16_sharing_a_2048_token_system_prompt() -> None:
    wl = build_workload("gsp")
    assert len(wl.requests) == 64 * 16
    assert {r.num_tokens for r in wl.requests} == {2048 + 128}
    assert {r.output_tokens for r in wl.requests} == {256}
    by_group = defaultdict(list)
    for r in wl.requests:
        by_group[r.group].append(r)
    assert len(by_group) == 64 and {len(v) for v in by_group.values()} == {16}
    g = list(by_group.values())
    assert shared_tokens(g[0][0].tokens, g[0][1].tokens) == 2048
    assert shared_tokens(g[0][0].tokens, g[1][0].tokens) == 0
    # groups are interleaved, not sent one after another
    assert len({r.group for r in wl.requests[:16]}) > 8


def test_chat_turns_extend_the_previous_prompt_with_its_answer_and_a_new_message() -> None:
    wl = build_workload("chat", sessions=30)
    sessions = defaultdict(list)
    for r in wl.requests:
        sessions[r.group].append(r)
    assert len(sessions) == 30
    interleaved = {r.group for r in wl.requests[:40]}
    assert len(interleaved) > 3
    s = wl.settings
    for turns in sessions.values():
        assert s["turns_min"] <= len(turns) <= s["turns_max"]
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.tokens.startswith(prev.tokens)
            added = nxt.num_tokens - prev.num_tokens - prev.output_tokens
            assert s["user_tokens_min"] <= added <= s["user_tokens_max"]
            assert nxt.arrival_s >= prev.arrival_s


def test_viral_prefix_appears_at_its_start_and_takes_its_share_of_a_surge() -> None:
    wl = build_workload("viral")
    s = wl.settings
    viral = [r for r in wl.requests if r.group == "viral"]
    after = [r for r in wl.requests if r.arrival_s >= s["viral_start_s"]]
    before = len(wl.requests) - len(after)
    assert viral and min(r.arrival_s for r in viral) >= s["viral_start_s"]
    assert abs(len(viral) / len(after) - s["viral_share"]) < 0.05
    rate_before = before / s["viral_start_s"]
    rate_after = len(after) / (s["duration_s"] - s["viral_start_s"])
    assert 2.5 < rate_after / rate_before < 3.5
    assert shared_tokens(viral[0].tokens, viral[1].tokens) == s["viral_prefix_tokens"]
    assert build_workload("viral").requests == wl.requests


def write_trace(path: Path, rows: list[dict]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f"trace:{path}"


def test_trace_requests_share_exactly_their_agreeing_hash_blocks(tmp_path: Path) -> None:
    spec = write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]},
            {"timestamp": 250, "input_length": 1100, "output_length": 0, "hash_ids": [1, 2, 9]},
            {"timestamp": 500, "input_length": 1024, "output_length": 5, "hash_ids": [4, 2]},
        ],
    )
    wl = build_workload(spec)
    a, b, c = wl.requests
    assert [r.num_tokens for r in wl.requests] == [1500, 1100, 1024]
    assert shared_tokens(a.tokens, b.tokens) == 2 * 512
    assert shared_tokens(a.tokens, c.tokens) == 0
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.25, 0.5]
    assert b.output_tokens == 1  # at least one token is generated

    small = build_workload(spec, block_tokens=32, speedup=2, limit=2)
    a2, b2 = small.requests
    assert len(small.requests) == 2
    assert shared_tokens(a2.tokens, b2.tokens) == 2 * 32
    assert a2.num_tokens == 2 * 32 + round(476 * 32 / 512)
    assert b2.arrival_s == 0.125
    # a block id always expands to the same tokens, whatever request it is in
    assert a.tokens[: 512 * TOKEN_BYTES] == b.tokens[: 512 * TOKEN_BYTES]
    assert c.tokens[512 * TOKEN_BYTES :] == a.tokens[512 * TOKEN_BYTES : 1024 * TOKEN_BYTES]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 1}', "missing 'hash_ids'"),
        ('{"timestamp": 1, "input_length": -3, "output_length": 1, "hash_ids": [1]}', "input_length"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}', "hash_ids"),
        ('{"timestamp": 1, "input_length": 1030, "output_length": 1, "hash_ids": [1]}', "do not cover"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_trace_line_names_the_line_and_the_problem(tmp_path: Path, line: str, problem: str) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=r"line 2: ") as err:
        build_workload(f"trace:{path}")
    assert problem in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_names_and_missing_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        build_workload("nope")
    with pytest.raises(ValueError, match="trace file not found"):
        build_workload(f"trace:{tmp_path / 'missing.jsonl'}")
    with pytest.raises(ValueError, match="has no setting 'colour'"):
        build_workload("gsp", colour=1)
    assert "trace:PATH" in WORKLOADS


def test_mooncake_trace_replays_every_request_at_full_size() -> None:
    wl = build_workload(f"trace:{MOONCAKE}")
    assert len(wl.requests) == 3993
    assert wl.total_prompt_tokens == 61_194_628
    assert math.isclose(wl.requests[-1].arrival_s, 1022.025)
    first = json.loads(MOONCAKE.read_text().splitlines()[0])
    assert wl.requests[0].num_tokens == first["input_length"]
    assert as_token_bytes(memoryview(wl.requests[0].tokens).cast("I")) == wl.requests[0].tokens


@pytest.mark.parametrize(
    ("value", "expected"), [(" on ", True), ("YES", True), (True, True), ("f", False), (0, False)]
)
def test_a_boolean_setting_is_read_as_the_engines_json_fields_are(value: object, expected: bool) -> None:
    """No shipped workload has a boolean setting yet; when one does, ``--set KEY=VALUE`` reads it with
    prefixfleet.sglang_fields.lax_bool (surrounding blanks ignored) and refuses anything else."""
    from prefixfleet.sim.workloads import _merge

    assert _merge({"flag": False}, {"flag": value}, "w")["flag"] is expected
    with pytest.raises(ValueError, match="workload 'w' setting 'flag' must be true or false, got 'maybe'"):
        _merge({"flag": False}, {"flag": "maybe"}, "w")
