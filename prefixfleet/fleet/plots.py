"""PNG of a live run: TTFT CDF per router/policy and hit-rate bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def write_live_plot(
    path: Path, title: str, ttfts_ms: Mapping[str, Sequence[float]], hit_rates: Mapping[str, float]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cdf, ax_hit) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    for name, values in ttfts_ms.items():
        data = sorted(values)
        if not data:
            continue
        ys = [(i + 1) / len(data) for i in range(len(data))]
        ax_cdf.plot(data, ys, label=name, linewidth=1.4)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("TTFT at the client (ms, wall clock)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.set_title("TTFT CDF")
    ax_cdf.grid(True, alpha=0.3)
    ax_cdf.legend(fontsize=8, loc="lower right")
    names = list(hit_rates)
    hits = [hit_rates[n] * 100 for n in names]
    ax_hit.barh(names, hits, color="#3b75af")
    for y, h in enumerate(hits):
        ax_hit.text(h + 0.5, y, f"{h:.1f}%", va="center", fontsize=8)
    ax_hit.set_xlim(0, 105)
    ax_hit.invert_yaxis()
    ax_hit.set_xlabel("prefix-cache hit rate (% of prompt tokens, engine-reported)")
    ax_hit.set_title("hit rate")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)  # the caller's outputs.writing made the directory
    plt.close(fig)
