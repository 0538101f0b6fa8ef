"""Scaler metrics, the comparison table and the over-time plot for elastic-fleet runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .autoscale import ElasticRun
from .report import percentile

NEW_REPLICA_WINDOW_S = 30.0


def replica_seconds(run: ElasticRun) -> float:
    """Replica-time paid for, starting and draining included, over [0, horizon]."""
    total = 0.0
    for m in run.members:
        end = run.horizon_s if m.removed_s is None else min(m.removed_s, run.horizon_s)
        total += max(0.0, end - m.created_s)
    return total


def new_replica_hit_rates(run: ElasticRun, window_s: float = NEW_REPLICA_WINDOW_S) -> list[float]:
    """Token-weighted hit rate of each added replica over its first ``window_s`` of serving."""
    prompt: dict[int, int] = {}
    cached: dict[int, int] = {}
    for arrival, member, p, c in zip(
        run.arrival_s, run.member, run.prompt_tokens, run.cached_tokens, strict=True
    ):
        m = run.members[member]
        if m.initial or m.ready_s is None or not m.ready_s <= arrival < m.ready_s + window_s:
            continue
        prompt[member] = prompt.get(member, 0) + p
        cached[member] = cached.get(member, 0) + c
    return [cached[k] / prompt[k] for k in sorted(prompt) if prompt[k]]


def scaler_metrics(run: ElasticRun, target_ttft_s: float) -> dict[str, Any]:
    """The five numbers the comparison is judged on (the JSON's ``scalers.NAME``)."""
    n = len(run.ttft_s)
    rates = new_replica_hit_rates(run)
    return {
        "slo_attainment": round(sum(1 for t in run.ttft_s if t <= target_ttft_s) / n, 4) if n else None,
        "p99_ttft_ms": round(percentile([t * 1000.0 for t in run.ttft_s], 99), 1) if n else None,
        "replica_seconds": round(replica_seconds(run), 1),
        "new_replica_hit_rate_30s": round(sum(rates) / len(rates), 4) if rates else None,
        "scale_events": run.scale_events,
    }


def run_details(run: ElasticRun) -> dict[str, Any]:
    """Context for the table (not part of the judged JSON): hit rate, peak size, warm-up cost."""
    prompt = sum(run.prompt_tokens)
    return {
        "hit_rate": sum(run.cached_tokens) / prompt if prompt else 0.0,
        "peak_replicas": max((row[1] for row in run.timeline), default=len(run.members)),
        "added": sum(1 for m in run.members if not m.initial),
        "warmup_tokens": run.warmup_tokens,
    }


def format_table(
    title: str, metrics: Mapping[str, Mapping[str, Any]], details: Mapping[str, Mapping[str, Any]]
) -> str:
    header = (
        f"{'scaler':<22}{'SLO att.':>9}{'p99 ms':>10}{'replica-s':>11}{'new hit 30s':>12}{'events':>8}"
        f"{'hit':>8}{'peak':>6}{'added':>7}{'warm-up tok':>13}"
    )
    lines = [title, header, "-" * len(header)]
    for name, m in metrics.items():
        d = details[name]
        new_hit = m["new_replica_hit_rate_30s"]
        new_hit_s = "-" if new_hit is None else f"{new_hit * 100:.1f}%"
        lines.append(
            f"{name:<22}{m['slo_attainment'] * 100:>8.1f}%{m['p99_ttft_ms']:>10.0f}"
            f"{m['replica_seconds']:>11.0f}"
            f"{new_hit_s:>12}{m['scale_events']:>8}{d['hit_rate'] * 100:>7.1f}%{d['peak_replicas']:>6}"
            f"{d['added']:>7}{d['warmup_tokens']:>13,}"
        )
    return "\n".join(lines)


def windowed_p99_ms(run: ElasticRun, window_s: float) -> tuple[list[float], list[float]]:
    """p99 TTFT of the requests arriving in each ``window_s`` window (x = window centre)."""
    if not run.arrival_s:
        return [], []
    buckets: dict[int, list[float]] = {}
    for a, t in zip(run.arrival_s, run.ttft_s, strict=True):
        buckets.setdefault(int(a // window_s), []).append(t * 1000.0)
    xs = sorted(buckets)
    return [(k + 0.5) * window_s for k in xs], [percentile(buckets[k], 99) for k in xs]


def write_plot(
    path: str, title: str, runs: Sequence[ElasticRun], target_ttft_s: float, window_s: float = 30.0
) -> None:
    """Replicas over time (top) and windowed p99 TTFT (bottom), one line per scaler, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_n, ax_p) = plt.subplots(2, 1, figsize=(12, 8), sharex=True)
    for run in runs:
        if run.timeline:
            ts = [0.0] + [row[0] for row in run.timeline]
            ns = [sum(1 for m in run.members if m.initial)] + [row[1] for row in run.timeline]
            ax_n.step(ts, ns, where="post", label=run.scaler, linewidth=1.6)
        xs, ys = windowed_p99_ms(run, window_s)
        ax_p.plot(xs, ys, marker=".", label=run.scaler, linewidth=1.4)
    ax_n.set_ylabel("replicas (incl. starting/draining)")
    ax_n.set_title("fleet size")
    ax_n.grid(True, alpha=0.3)
    ax_n.legend(fontsize=8, loc="upper left")
    ax_p.axhline(target_ttft_s * 1000.0, color="#888888", linestyle="--", linewidth=1, label="TTFT target")
    ax_p.set_yscale("log")
    ax_p.set_ylabel(f"p99 TTFT over {window_s:g} s windows (ms)")
    ax_p.set_xlabel("time (s)")
    ax_p.grid(True, alpha=0.3)
    ax_p.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
