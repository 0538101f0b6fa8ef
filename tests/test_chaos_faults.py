"""Faults under load on a local fleet of real processes (4 engines + sidecars, 2 gateways, Valkey).

Specification (short runs of the ``prefixfleet chaos`` scenarios; the long runs are benchmarks):
* an engine and its sidecar killed mid-run lose no non-streaming request (the gateway re-sends it
  elsewhere) and every stream either completes or ends with an SSE error event — never a hang, never
  a silent truncation;
* Redis stopped for a few seconds and restarted empty causes no 5xx: gateways route on their last
  view plus their overlay, and membership, summaries and the gateways' views come back;
* with one of two gateways killed, requests through the other keep succeeding and a client that
  retries on connection errors loses nothing;
* the soak scenario holds its rate with no errors and the gateway's memory stays bounded.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fleet_fixtures import prefixfleet_argv

from prefixfleet.chaos.scenarios import ChaosFleet, engine_kill, gateway_kill, redis_outage, soak
from prefixfleet.chaos.traffic import TrafficPlan

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]


def assert_nothing_lost(figures: dict) -> None:
    assert figures["non_streaming_lost"] == 0, figures
    assert figures["hangs"] == 0, figures
    assert figures["streams_truncated_silently"] == 0, figures
    assert figures["http_5xx"] == 0, figures


async def test_killing_one_of_four_engines_loses_no_request_and_cut_streams_end_with_an_error_event(
    tmp_path: Path,
):
    plan = TrafficPlan(rate_per_s=30, duration_s=6, stream_fraction=0.5, max_tokens=96)
    report = await engine_kill(tmp_path, plan, ChaosFleet(replicas=4, gateways=2), kill_at_s=2.0)
    overall = report["overall"]
    assert_nothing_lost(overall)
    assert overall["ok"] + overall["streams_cut_with_error_event"] == overall["requests"]
    # nothing routed to the dead worker once the gateways noticed (its answers would be failures)
    assert report["answered_by_dead_worker_1s_after_kill"] == 0
    assert report["after_kill"]["requests"] > 0


async def test_a_redis_outage_causes_no_5xx_and_the_fleet_recovers(tmp_path: Path):
    plan = TrafficPlan(rate_per_s=25, duration_s=8, stream_fraction=0.3)
    fleet = ChaosFleet(replicas=4, gateways=2)
    # recovery takes about a second; waited for at most 30 s, so that a part that never recovers is
    # named by the assertion below (as None) instead of the test's timeout cutting the wait short
    report = await redis_outage(tmp_path, plan, fleet, outage_s=3.0, stop_at_s=1.5, recovery_wait_s=30.0)
    assert report["during_outage"]["requests"] > 0
    for phase in ("before_outage", "during_outage", "after_restart"):
        figures = report[phase]
        assert_nothing_lost(figures)
        assert figures["ok"] == figures["requests"], (phase, figures)
    recovery = report["recovery_s"]
    assert all(recovery[k] is not None for k in ("membership", "summaries", "gateway_views")), recovery
    assert all(n >= 1 for n in report["gateway_redis_warnings"]), "each gateway noticed the outage"


async def test_killing_one_of_two_gateways_loses_nothing_for_a_client_that_retries(tmp_path: Path):
    plan = TrafficPlan(rate_per_s=30, duration_s=6, stream_fraction=0.3, client_retries=1)
    report = await gateway_kill(tmp_path, plan, ChaosFleet(replicas=2, gateways=2), kill_at_s=2.0)
    overall = report["overall"]
    assert overall["ok"] == overall["requests"], overall
    through_survivor = report["after_kill_through_survivor"]
    assert through_survivor["requests"] > 0 and through_survivor["ok"] == through_survivor["requests"]
    # requests aimed at the dead gateway after the kill were recovered by the client's retry
    assert report["recovered_by_client_retry"] >= 1


async def test_a_short_soak_holds_its_rate_with_no_errors_and_bounded_gateway_memory(tmp_path: Path):
    plan = TrafficPlan(rate_per_s=30, duration_s=5, stream_fraction=0.2, unique_prefixes=True)
    report = await soak(tmp_path, plan, ChaosFleet(replicas=2, gateways=1), sample_every_s=0.5)
    overall = report["overall"]
    assert overall["ok"] == overall["requests"] == 150, overall
    rss = report["gateway_rss_mib"]
    assert rss["start"] is not None and rss["max"] < 400, rss  # generous: a Python gateway is ~60-90 MiB
    assert len(report["samples"]) >= 5


def test_the_chaos_command_prints_its_figures_and_writes_json(tmp_path: Path):
    out = tmp_path / "soak.json"
    argv = prefixfleet_argv(
        "chaos", "soak", "--duration", "3", "--rate", "10", "--replicas", "1", "--json", str(out),
        "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "== chaos soak ==" in done.stdout and "gateway RSS MiB" in done.stdout
    report = json.loads(out.read_text())
    assert report["overall"]["requests"] == 30 and report["overall"]["ok"] == 30


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["engine-kill", "--replicas", "1"], "--replicas must be at least 2"),
        (["gateway-kill", "--gateways", "1"], "--gateways must be at least 2"),
        (["soak", "--rate", "0"], "--rate must be a positive number"),
        (["redis-outage", "--outage", "-1"], "--outage must be positive"),
        (["soak", "--policy", "nope"], "unknown --policy"),
    ],
)
def test_bad_chaos_flags_are_refused_with_one_line(args, message):
    done = subprocess.run(prefixfleet_argv("chaos", *args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
