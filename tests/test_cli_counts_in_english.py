"""Counts in the CLI's titles and one-line summaries agree with their number: "1 engine", not "1 engines".

`prefixfleet compare`'s title said "1 engines" and "1 round(s)"; `sim` and `sim-autoscale` said
"1 requests" and "1 replicas"; `load` said "1 requests to" and "1 of 1 requests failed"; `chaos`
said "1 engines+sidecars, 1 gateway(s)"; the local fleet's membership timeout "0 of 1 workers".
`up` already counted in English (tests/test_fleet_up_title.py); the rest now use the same helper.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prefixfleet.chaos.report import format_report
from prefixfleet.cli import main
from prefixfleet.fleet import local
from prefixfleet.fleet.compare import format_compare
from prefixfleet.fleet.processes import ChildFailedError

TRACE = Path(__file__).resolve().parents[1] / "traces" / "mooncake_synthetic_trace.jsonl"


def _compare_report(requests: int, repeats: int, replicas: int) -> dict[str, Any]:
    engine = {"cache_tokens": 4096, "time_scale": 20.0}
    settings = {"requests": requests, "repeats": repeats, "replicas": replicas, "engine": engine}
    latency = {
        "rate_rps_per_path": 50.0,
        **dict.fromkeys(("gateway_p50_ms", "gateway_p99_ms", "direct_p50_ms", "direct_p99_ms"), 1.0),
        "one_at_a_time_added_p50_ms": 0.1,
    }
    return {
        "workload": "prefixroute",
        "settings": settings,
        "routers": {},
        "details": {"added_latency": latency},
        "added_latency_ms": {"p50": 0.1, "p99": 0.2},
        "acceptance": {},
    }


@pytest.mark.parametrize(
    ("counts", "said"),
    [
        ((1, 1, 1), "prefixroute: 1 request × 1 round, 1 engine × 4096 cache tokens"),
        ((600, 3, 4), "prefixroute: 600 requests × 3 rounds, 4 engines × 4096 cache tokens"),
    ],
)
def test_compare_title_counts_in_english(counts: tuple[int, int, int], said: str) -> None:
    title = format_compare(_compare_report(*counts)).splitlines()[0]
    assert title == f"{said}, time-scale 20.0 (TTFT wall-clock ms)"


def test_sim_title_counts_in_english(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--workload", "prefixroute", "--set", "num_requests=1", "--replicas", "1"]
    assert main([*argv, "--cache-tokens", "100000", "--policies", "round_robin", "--no-progress"]) == 0
    assert "prefixroute: 1 request, 1 replica × 100000 cache tokens" in capsys.readouterr().out


def test_sim_autoscale_title_counts_in_english(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim-autoscale", "--scenario", f"trace:{TRACE}", "--set", "limit=1", "--scalers", "uniform"]
    assert main([*argv, "--no-progress"]) == 0
    assert f"trace:{TRACE}: 1 request over " in capsys.readouterr().out


def test_load_counts_in_english(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # bound, never listening: the one request is refused at once
        s.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{s.getsockname()[1]}"
        argv = ["load", "--target", target, "--workload", "prefixroute", "--set", "num_requests=1"]
        assert main([*argv, "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert f"prefixroute: 1 request to {target}" in captured.out
    assert "load: 1 of 1 request failed (exit status 1)" in captured.err


def test_chaos_report_counts_in_english() -> None:
    report = {"scenario": "engine-kill", "fleet": {"replicas": 1, "gateways": 1}, "plan": {}}
    assert format_report(report).splitlines()[1].startswith("fleet: 1 engine+sidecar pair, 1 gateway, ")


async def test_membership_timeout_counts_in_english(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_workers(session: object, url: str) -> int:
        return 0

    monkeypatch.setattr(local, "_gateway_worker_count", no_workers)
    gateway = SimpleNamespace(url="http://127.0.0.1:9", name="gateway-0", log_path=None, log_tail=str)
    fleet = SimpleNamespace(replicas=[object()], gateways=[gateway])
    with pytest.raises(ChildFailedError) as err:
        # timeout 0: the deadline has passed at the first look, so no waiting and no supervisor
        await local.LocalFleet.wait_for_membership(fleet, timeout_s=0)  # type: ignore[arg-type]
    assert "http://127.0.0.1:9 sees 0 of 1 worker after 0s" in str(err.value)
