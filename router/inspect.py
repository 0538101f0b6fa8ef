"""`prefixfleet router inspect`: what one fleet has published in Redis, decoded and checked.

The report is built by a pure function over the raw values (so it is testable and reusable, e.g. by
the operator's status); the shell only reads Redis. Hashes are shown as counts, never listed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .records import decode_load, decode_member
from .summary import SummaryError, decode_summary


def fleet_report(
    members: Mapping[str, bytes | str],
    loads: Mapping[str, bytes | str | None],
    summaries: Mapping[str, bytes | None],
    now: float,
) -> dict[str, Any]:
    """One row per member: its record, load and summary decoded, with every problem named."""
    rows: list[dict[str, Any]] = []
    for wid in sorted(members):
        row: dict[str, Any] = {"worker_id": wid, "problems": []}
        try:
            member = decode_member(members[wid])
            row.update(url=member.url, member_state=member.state, model=member.model,
                       revision=member.revision)  # fmt: skip
        except SummaryError as exc:
            row["problems"].append(f"member: {exc}")
        raw_load = loads.get(wid)
        if raw_load is None:
            row["problems"].append("no load record (not started, or dead: heartbeat expired)")
        else:
            try:
                load = decode_load(raw_load)
                row.update(
                    state=load.state,
                    engine_ok=load.engine_ok,
                    heartbeat_age_s=round(max(now - load.ts, 0.0), 3),
                    in_flight=load.in_flight,
                    queued=load.queued,
                    pending_prefill_tokens=load.pending_prefill_tokens,
                    prefill_tokens_per_s=load.prefill_tokens_per_s,
                    cached_tokens=load.cached_tokens,
                    capacity_tokens=load.capacity_tokens,
                )
            except SummaryError as exc:
                row["problems"].append(f"load: {exc}")
        raw_summary = summaries.get(wid)
        if raw_summary is None:
            row["problems"].append("no summary")
        else:
            try:
                summary = decode_summary(raw_summary)
                row.update(
                    summary_version=summary.version,
                    summary_age_s=round(max(now - summary.generated_at, 0.0), 3),
                    summary_blocks=len(summary.blocks),
                    summary_bytes=len(raw_summary),
                    summary_truncated=summary.truncated,
                    hot_nodes=len(summary.hot),
                    hottest_prefix_tokens=max((n.tokens for n in summary.hot), default=0),
                )
                if summary.worker != wid:
                    row["problems"].append(f"summary names worker {summary.worker!r}")
            except SummaryError as exc:
                row["problems"].append(f"summary: {exc}")
        rows.append(row)
    return {"workers": rows, "healthy": all(not r["problems"] for r in rows)}


_COLUMNS = (
    ("worker_id", "worker"),
    ("state", "state"),
    ("engine_ok", "engine"),
    ("heartbeat_age_s", "beat s"),
    ("in_flight", "in flight"),
    ("pending_prefill_tokens", "pending tok"),
    ("prefill_tokens_per_s", "prefill tok/s"),
    ("cached_tokens", "cached"),
    ("capacity_tokens", "capacity"),
    ("summary_version", "summary v"),
    ("summary_blocks", "blocks"),
    ("summary_age_s", "age s"),
)


def format_report(report: dict[str, Any]) -> str:
    rows = report["workers"]
    if not rows:
        return "no members"
    cells = [[str(r.get(key, "-")) for key, _ in _COLUMNS] for r in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (_, title) in enumerate(_COLUMNS)]
    lines = ["  ".join(title.ljust(widths[i]) for i, (_, title) in enumerate(_COLUMNS))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c[i].ljust(widths[i]) for i in range(len(widths))) for c in cells]
    for r in rows:
        lines += [f"{r['worker_id']}: {p}" for p in r["problems"]]
    return "\n".join(lines)


def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
