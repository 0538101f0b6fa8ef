"""Metrics, the comparison table and the plot for simulator runs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .simulator import RunResult

MAX_GROUPS_REPORTED = 64  # per-group stats only when groups are few enough to read


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of ``values``; q in [0, 100]."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(run: RunResult) -> dict[str, Any]:
    """Per-policy metrics; TTFTs in milliseconds, hit rate token-weighted."""
    ttft_ms = [t * 1000.0 for t in run.ttft_s]
    prompt = sum(run.prompt_tokens)
    cached = sum(run.cached_tokens)
    n = len(ttft_ms)
    out: dict[str, Any] = {
        "requests": n,
        "mean_ttft_ms": round(sum(ttft_ms) / n, 3) if n else math.nan,
        "p50_ttft_ms": round(percentile(ttft_ms, 50), 3),
        "p99_ttft_ms": round(percentile(ttft_ms, 99), 3),
        "max_ttft_ms": round(max(ttft_ms), 3) if n else math.nan,
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
    }
    if run.name != "ideal":
        counts = [0] * run.replicas
        for r in run.replica:
            counts[r] += 1
        shares = [c / n for c in counts] if n else [0.0] * run.replicas
        out["replica_share"] = [round(s, 4) for s in shares]
        out["max_replica_share"] = round(max(shares), 4)
        out["evicted_tokens"] = run.evicted_tokens
        out["decisions"] = dict(sorted(run.decisions.items()))
    else:
        out["max_replica_share"] = round(1.0 / run.replicas, 4)  # the bound spreads load perfectly
        out["evicted_tokens"] = 0
    groups = sorted(set(run.groups))
    if 1 < len(groups) <= MAX_GROUPS_REPORTED:
        per: dict[str, dict[str, float]] = {}
        for g in groups:
            idx = [i for i, x in enumerate(run.groups) if x == g]
            g_ttft = [ttft_ms[i] for i in idx]
            g_prompt = sum(run.prompt_tokens[i] for i in idx)
            per[g] = {
                "requests": len(idx),
                "mean_ttft_ms": round(sum(g_ttft) / len(idx), 3),
                "p99_ttft_ms": round(percentile(g_ttft, 99), 3),
                "hit_rate": round(sum(run.cached_tokens[i] for i in idx) / g_prompt, 4) if g_prompt else 0.0,
            }
        out["groups"] = per
    return out


def format_table(
    title: str, metrics: Mapping[str, Mapping[str, Any]], default_policy: str | None = None
) -> str:
    header = (
        f"{'policy':<22}{'mean ms':>10}{'p50 ms':>10}{'p99 ms':>10}{'hit':>8}"
        f"{'prefill tok':>14}{'max share':>11}"
    )
    lines = [title, header, "-" * len(header)]
    for name, m in metrics.items():
        label = f"{name}*" if name == default_policy else name
        lines.append(
            f"{label:<22}{m['mean_ttft_ms']:>10.1f}{m['p50_ttft_ms']:>10.1f}{m['p99_ttft_ms']:>10.1f}"
            f"{m['hit_rate'] * 100:>7.1f}%{m['prefill_tokens']:>14,}{m['max_replica_share']:>11.3f}"
        )
    if default_policy in metrics:
        lines.append("* default policy")
    return "\n".join(lines)


def write_plot(
    path: str,
    title: str,
    runs: Sequence[RunResult],
    metrics: Mapping[str, Mapping[str, Any]],
    default_policy: str | None = None,
) -> None:
    """TTFT CDF per policy (left) and hit rate per policy (right), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cdf, ax_hit) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    for run in runs:
        data = sorted(t * 1000.0 for t in run.ttft_s)
        n = len(data)
        ys = [(i + 1) / n for i in range(n)]
        style = "--" if run.name == "ideal" else "-"
        is_default = run.name == default_policy
        label = f"{run.name} (default)" if is_default else run.name
        ax_cdf.plot(data, ys, style, label=label, linewidth=2.4 if is_default else 1.4)
    ax_cdf.set_xscale("symlog", linthresh=1.0)
    ax_cdf.set_xlabel("TTFT (ms)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.set_title("TTFT CDF")
    ax_cdf.grid(True, alpha=0.3)
    ax_cdf.legend(fontsize=8, loc="lower right")
    names = list(metrics)
    hits = [metrics[n]["hit_rate"] * 100 for n in names]
    colors = ["#888888" if n == "ideal" else "#d0622b" if n == default_policy else "#3b75af" for n in names]
    ax_hit.barh(names, hits, color=colors)
    for y, h in enumerate(hits):
        ax_hit.text(h + 0.5, y, f"{h:.1f}%", va="center", fontsize=8)
    ax_hit.set_xlim(0, 105)
    ax_hit.invert_yaxis()
    ax_hit.set_xlabel("prefix-cache hit rate (% of prompt tokens)")
    ax_hit.set_title("hit rate")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
