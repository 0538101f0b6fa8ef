"""`sim --reproduce lab`: our implementation of the seed lab's model reproduces its published table."""

from __future__ import annotations

import json

from prefixfleet.cli import main
from prefixfleet.sim.lab import LabFleet, LabSettings, reproduce_lab

PUBLISHED = {
    # policy: (cache_hit_ratio, mean_ttft_ms, max_ttft_ms, max/min replica requests, evicted tokens)
    "round_robin": (0.7353, 47.19, 108.8, 8, 8, 3072),
    "pure_affinity": (0.4412, 1217.24, 1625.6, 32, 0, 69632),
    "cache_aware": (0.8235, 32.34, 108.8, 20, 4, 0),
}


def test_reproduction_equals_the_published_numbers_exactly() -> None:
    report = reproduce_lab()
    assert report["workload_requests"] == 32
    for name, (hit, mean, mx, max_req, min_req, evicted) in PUBLISHED.items():
        got = report["policies"][name]
        assert got["cache_hit_ratio"] == hit, name
        assert got["mean_ttft_ms"] == mean, name
        assert got["max_ttft_ms"] == mx, name
        assert got["max_replica_requests"] == max_req, name
        assert got["min_replica_requests"] == min_req, name
        assert got["total_evicted_tokens"] == evicted, name


def test_reproduction_matches_the_published_per_replica_caches() -> None:
    loads = {
        name: [(r["routed_requests"], r["cached_tokens"], r["evicted_tokens"]) for r in p["replica_loads"]]
        for name, p in reproduce_lab()["policies"].items()
    }
    assert loads["round_robin"] == [(8, 9216, 1024), (8, 6144, 0), (8, 9216, 1024), (8, 9216, 1024)]
    assert loads["pure_affinity"] == [(32, 8192, 69632), (0, 0, 0), (0, 0, 0), (0, 0, 0)]
    assert loads["cache_aware"] == [(4, 5120, 0), (20, 9216, 0), (4, 5120, 0), (4, 5120, 0)]


def test_lab_queue_drains_a_fixed_amount_per_arrival_and_never_goes_negative() -> None:
    fleet = LabFleet.build(LabSettings(replicas=1, cache_tokens=100, queue_decay_ms_per_arrival=14.0))
    first = fleet.route(list(range(40)), "round_robin")  # 40 tokens × 0.025 ms
    assert first == 1.0
    second = fleet.route(list(range(40)), "round_robin")  # full hit: 40 × 0.0015 ms; the 1 ms queue drained
    assert second == 0.06
    assert fleet.replicas[0].queue_wait_ms == 0.06


def test_cli_reproduce_lab_writes_the_labs_json_keys(tmp_path, capsys) -> None:
    out = tmp_path / "lab.json"
    assert main(["sim", "--reproduce", "lab", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1217.24" in printed and "0.8235" in printed
    data = json.loads(out.read_text())
    assert set(data["policies"]) == set(PUBLISHED)
    for policy in data["policies"].values():
        assert {"cache_hit_ratio", "mean_ttft_ms", "max_ttft_ms", "replica_loads"} <= set(policy)
