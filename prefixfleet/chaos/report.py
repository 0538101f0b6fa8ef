"""Plain-text rendering of a chaos report (the JSON holds everything; this prints the headlines)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefixfleet.cli import counted

_ROW_KEYS = (
    ("requests", "requests"),
    ("ok", "ok"),
    ("non_streaming_lost", "non-stream lost"),
    ("streams_cut_with_error_event", "streams cut (error event)"),
    ("streams_truncated_silently", "streams cut silently"),
    ("hangs", "hangs"),
    ("connection_errors", "connection errors"),
    ("http_5xx", "5xx"),
    ("http_4xx", "4xx"),
    ("client_retried", "client retries"),
    ("p50_latency_ms", "p50 ms"),
    ("p99_latency_ms", "p99 ms"),
    ("hit_rate", "hit rate"),
)
_PHASES = (
    "overall",
    "before_outage",
    "during_outage",
    "after_restart",
    "after_kill",
    "after_kill_through_survivor",
    "after_kill_aimed_at_dead_gateway",
)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1 else f"{value:.1f}"
    return str(value)


def phase_table(report: Mapping[str, Any]) -> str:
    phases = [p for p in _PHASES if isinstance(report.get(p), Mapping)]
    width = max(len(label) for _, label in _ROW_KEYS)
    cols = [max(len(p), 8) for p in phases]
    lines = [" " * width + "  " + "  ".join(p.rjust(c) for p, c in zip(phases, cols, strict=True))]
    for key, label in _ROW_KEYS:
        cells = [_fmt(report[p].get(key)).rjust(c) for p, c in zip(phases, cols, strict=True)]
        lines.append(label.ljust(width) + "  " + "  ".join(cells))
    return "\n".join(lines)


def format_report(report: Mapping[str, Any]) -> str:
    lines = [f"== chaos {report['scenario']} =="]
    plan = report.get("plan", {})
    fleet = report.get("fleet", {})
    pairs = counted(fleet.get("replicas"), "engine+sidecar pair")
    lines.append(
        f"fleet: {pairs}, {counted(fleet.get('gateways'), 'gateway')}, "
        f"policy {fleet.get('policy')}, time-scale {fleet.get('time_scale')}; traffic: "
        f"{plan.get('rate_per_s')} req/s for {plan.get('duration_s')} s, "
        f"{plan.get('stream_fraction', 0) * 100:.0f}% streamed"
    )
    for key in (
        "killed_worker",
        "killed_gateway",
        "killed_at_s",
        "redis_stopped_at_s",
        "redis_restarted_at_s",
    ):
        if report.get(key) is not None:
            lines.append(f"{key}: {_fmt(report[key])}")
    if "recovery_s" in report:
        rec = report["recovery_s"]
        lines.append("recovery after restart (s): " + ", ".join(f"{k} {_fmt(v)}" for k, v in rec.items()))
    for key in ("retries_by_gateways", "answered_by_dead_worker_1s_after_kill", "recovered_by_client_retry"):
        if key in report:
            lines.append(f"{key}: {_fmt(report[key])}")
    if "gateway_rss_mib" in report:
        rss = report["gateway_rss_mib"]
        lines.append(
            "gateway RSS MiB: "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in rss.items())
            + f"; sidecar max {_fmt(report.get('sidecar_rss_mib_max'))}"
            + f"; achieved {_fmt(report.get('achieved_rate_per_s'))} req/s"
        )
    lines.append(phase_table(report))
    return "\n".join(lines)
