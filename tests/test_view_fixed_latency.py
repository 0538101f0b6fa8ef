"""The engine's fixed per-step latency: measured by the sidecar, published, added to every wait.

A batched engine makes even a request with nothing queued ahead wait for the step in progress and
the fixed part of its own prefill pass. The simulator's views include that; without it a live
gateway saw idle replicas as free, and queue_aware priced misses at bare prefill and routed away
from busy holders of a prefix far more often than the simulator does on the same requests.
"""

from __future__ import annotations

import pytest
from fleet_fixtures import free_port, prefixfleet_argv, wait_for_http, wait_until

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.loadtrack import LoadTracker
from prefixfleet.router.policies import CostModel, make_policy
from prefixfleet.router.policies.base import RouteRequest
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import LoadReport, MemberRecord, decode_load, encode_record
from prefixfleet.router.view import FleetView

B = 16
RATE = 5000.0
SEED = CacheIdentity("m", "r").seed()


def test_the_tracker_learns_fixed_latency_only_from_requests_with_nothing_queued_ahead() -> None:
    t = LoadTracker(prefill_tokens_per_s=1000.0)
    assert t.fixed_latency_s == 0.0  # nothing measured yet: routers add nothing
    a = t.admit(100, 0.0, timed=True)  # nothing ahead: 0.1 s of prefill, first byte at 0.15
    b = t.admit(100, 0.01, timed=True)  # queued behind a: its wait is queueing, not fixed cost
    t.first_byte(a, 0.15)
    t.first_byte(b, 0.5)
    t.finish(a, 0.2)
    t.finish(b, 0.6)
    assert t.latency_samples == 1 and t.fixed_latency_s == pytest.approx(0.05)
    untimed = t.admit(100, 10.0, timed=False)  # its first byte comes after decoding: no sample
    t.first_byte(untimed, 15.0)
    t.finish(untimed, 15.0)
    assert t.latency_samples == 1


def test_a_mix_of_hits_and_misses_separates_the_prefill_rate_from_the_fixed_latency() -> None:
    # An engine at 2000 tok/s with 0.05 s of fixed cost per request, serving mostly cache hits
    # (50 uncached tokens) and some misses (900). Busy periods count the fixed cost as prefill time
    # and read a fraction of the real rate; the line through (tokens, first-byte time) does not.
    t = LoadTracker(prefill_tokens_per_s=2000.0)
    for i in range(80):
        u = 900 if i % 4 == 0 else 50
        h = t.admit(u, 10.0 * i, timed=True)
        t.first_byte(h, 10.0 * i + u / 2000 + 0.05)
        t.finish(h, 10.0 * i + 1.0)
    assert t.fitted
    assert t.prefill_tokens_per_s == pytest.approx(2000, rel=0.02)
    assert t.fixed_latency_s == pytest.approx(0.05, rel=0.05)


def test_without_a_spread_of_sizes_the_fixed_latency_is_what_the_busy_period_rate_leaves() -> None:
    t = LoadTracker(prefill_tokens_per_s=2000.0)
    for i in range(40):  # every prompt the same size: the line's slope is not identifiable
        h = t.admit(1000, 10.0 * i, timed=True)
        t.first_byte(h, 10.0 * i + 0.55)
        t.finish(h, 10.0 * i + 1.0)
    assert not t.fitted
    predicted = 1000 / t.prefill_tokens_per_s + t.fixed_latency_s
    assert predicted == pytest.approx(0.55, rel=0.05)


def test_load_records_carry_fixed_latency_and_older_records_read_as_zero() -> None:
    load = LoadReport(1, 2.0, "ready", True, 3, 1, 40, 5.0, 6, 7, 8, fixed_latency_s=0.035)
    assert decode_load(encode_record(load)) == load
    old = encode_record(LoadReport(1, 2.0, "ready", True, 3, 1, 40, 5.0, 6, 7, 8)).replace(
        ',"fixed_latency_s":0.0', ""
    )
    assert "fixed_latency_s" not in old
    assert decode_load(old).fixed_latency_s == 0.0


def _load(seq: int, *, pending: int, fixed_latency_s: float) -> str:
    return encode_record(
        LoadReport(
            seq=seq,
            ts=100.0,
            state="ready",
            engine_ok=True,
            in_flight=1 if pending else 0,
            queued=1 if pending else 0,
            pending_prefill_tokens=pending,
            prefill_tokens_per_s=RATE,
            cached_tokens=0,
            capacity_tokens=4000,
            summary_version=0,
            fixed_latency_s=fixed_latency_s,
        )
    )


def _fleet(fixed_latency_s: float) -> tuple[FleetView, list[int], int]:
    """w1 holds the request's first 784 tokens and is prefilling another 850-token prompt; w2 is idle."""
    view = FleetView(block_tokens=B, default_identity=CacheIdentity("m", "r"))
    member = encode_record(MemberRecord(url="http://127.0.0.1:9", model="m", revision="r", block_tokens=B))
    view.apply_snapshot(
        {"w1": member, "w2": member},
        {
            "w1": _load(1, pending=850, fixed_latency_s=fixed_latency_s),
            "w2": _load(1, pending=0, fixed_latency_s=fixed_latency_s),
        },
        now=0.0,
    )
    prompt = as_token_bytes(list(range(1000, 1859)))
    chain = view.request_hashes(prompt, None, view.workers.values())[(SEED, B)]
    view.record_send("w1", chain[: 784 // B], 0, wall_now=99.0)  # its earlier turn went there
    return view, chain, len(prompt) // 4


def test_every_replicas_wait_includes_its_reported_fixed_latency() -> None:
    view, chain, n = _fleet(0.1)
    rows = {
        r.replica_id: r
        for r in view.replica_states(list(view.workers.values()), {(SEED, B): chain}, n, 100.5)
    }
    assert rows["w1"].matched_tokens == 784 and rows["w2"].matched_tokens == 0
    assert rows["w1"].wait_s == pytest.approx(850 / RATE + 0.1)
    assert rows["w2"].wait_s == pytest.approx(0.1)


@pytest.mark.parametrize(("fixed_latency_s", "expected"), [(0.1, "w1"), (0.0, "w2")])
def test_queue_aware_keeps_a_busy_holder_once_the_engines_fixed_latency_is_in_the_view(
    fixed_latency_s: float, expected: str
) -> None:
    # With every replica paying the engine's fixed step cost, even the idlest one makes a cold
    # prefill wait, so the policy's congestion term prices the miss; without it (a sidecar that does
    # not measure it) an idle replica looks free and the 784 cached tokens are given away.
    view, chain, n = _fleet(fixed_latency_s)
    rows = view.replica_states(list(view.workers.values()), {(SEED, B): chain}, n, 100.5)
    policy = make_policy("queue_aware", CostModel(prefill_s_per_token=1.0 / RATE))
    decision = policy.choose(RouteRequest(tokens=b"", num_tokens=n, now=100.5), rows)
    assert decision.replica_id == expected


@pytest.mark.timeout(60)
def test_a_sidecar_in_front_of_the_emulator_starts_from_its_stated_step_costs(spawn, redis_server) -> None:
    # The emulator states its timing in /get_server_info, as it does its prefill speed: a cold
    # sidecar publishes (prefill pass overhead + decode step) / time scale before any request.
    engine_port, sidecar_port = free_port(), free_port()
    engine = spawn(
        prefixfleet_argv("emulator", "--port", str(engine_port), "--time-scale", "4"), name="engine"
    )
    wait_for_http(f"http://127.0.0.1:{engine_port}/health", proc=engine.proc)
    sidecar = spawn(
        prefixfleet_argv(
            "router",
            "sidecar",
            "--engine",
            f"http://127.0.0.1:{engine_port}",
            "--redis",
            redis_server.url,
            "--port",
            str(sidecar_port),
            "--worker-id",
            "w0",
            "--fleet",
            "t",
            "--publish-interval",
            "0.1",
        ),
        name="sidecar",
    )
    wait_for_http(f"http://127.0.0.1:{sidecar_port}/prefixfleet/status", proc=sidecar.proc)
    stated = EmulatorConfig()
    expected = (stated.prefill_overhead_s + stated.decode_step_s) / 4
    client = redis_server.client()

    def published_latency() -> float:
        raw = client.get(FleetKeys("t").load("w0"))
        return decode_load(raw).fixed_latency_s if raw is not None else 0.0

    # republished every 0.1 s, with the engine's stated costs once the sidecar has read them: wait on
    # that state (a 5 s loop that fell through to the assertion was short on a loaded machine)
    latency = wait_until(published_latency, 30, "a load record with the engine's fixed latency")
    assert latency == pytest.approx(expected, rel=0.01)
