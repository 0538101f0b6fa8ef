"""``prefixfleet report``: the dashboard's main panels as PNGs, straight from a Prometheus.

For users without Grafana and for the README's pictures. The panels and their queries are the
dashboard's own (:mod:`.dashboard`, those marked ``in_report``); the variables are filled from the
flags (``--fleet``/``--namespace`` as regex matchers, ``$__rate_interval`` from ``--rate-window``).
Each panel becomes ``OUT/<slug>.png``; ``OUT/overview.png`` has them all on one page and
``OUT/report.json`` the last value of every series.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .dashboard import PANELS, Panel, substitute

# Matched with fullmatch: ``$`` with re.match also accepts a trailing newline ("fleet\n"), which
# would then land inside a PromQL label matcher.
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
MAX_POINTS = 240


def parse_duration(text: str) -> float:
    """Prometheus-style duration ("15m", "1h30m", "90s", "2d") in seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise ValueError(f"not a duration like 15m, 1h or 90s: {text!r}")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    seconds = d * 86400 + h * 3600 + mi * 60 + s
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return float(seconds)


def prom_duration(seconds: float) -> str:
    return f"{max(round(seconds), 1)}s"


@dataclass(frozen=True, slots=True)
class Window:
    start: float  # unix seconds
    end: float
    step_s: float
    rate_window_s: float

    @classmethod
    def last(cls, since_s: float, *, end: float | None = None, rate_window_s: float | None = None) -> Window:
        end = time.time() if end is None else end
        step = max(since_s / MAX_POINTS, 1.0)
        rate = rate_window_s if rate_window_s is not None else max(60.0, 4 * step)
        return cls(end - since_s, end, step, rate)


def regex_matching(name: str) -> str:
    r"""``name`` as the body of a PromQL ``=~"..."`` matching exactly it: regex-escaped, then each
    backslash doubled for the PromQL string, whose lexer refuses ``\-`` and ``\.`` ("unknown escape
    sequence"): with the regex escape alone, ``--fleet emulator-fleet`` failed every query."""
    return re.escape(name).replace("\\", "\\\\")


def panel_variables(fleet: str | None, namespace: str | None, window: Window) -> dict[str, str]:
    return {
        "fleet": regex_matching(fleet) if fleet else ".*",
        "namespace": regex_matching(namespace) if namespace else ".*",
        "__rate_interval": prom_duration(window.rate_window_s),
    }


def legend(fmt: str, labels: dict[str, str]) -> str:
    text = _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt) if fmt else ""
    return text or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    times: list[float]
    values: list[float]


class PrometheusUnreachable(RuntimeError):
    pass


class QueryFailed(RuntimeError):
    pass


class PrometheusSource:
    """Range queries through prometheus-api-client, failing fast with a readable error."""

    def __init__(self, url: str, *, timeout_s: float = 15.0) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url.rstrip("/")
        self._client = PrometheusConnect(
            url=self.url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.1), timeout=timeout_s
        )

    def check(self) -> None:
        import requests

        try:
            ok = self._client.check_prometheus_connection()
        except requests.RequestException as exc:
            raise PrometheusUnreachable(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from None
        if not ok:
            raise PrometheusUnreachable(f"{self.url} answered, but not like a Prometheus server")

    def instant(self, expr: str, at: float) -> list[dict[str, Any]]:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return self._client.custom_query(expr, params={"time": f"{at:.3f}"})
        except requests.RequestException as exc:
            raise PrometheusUnreachable(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from None
        except PrometheusApiClientException as exc:
            raise QueryFailed(f"query failed: {exc}\n  {expr}") from None

    def range(self, expr: str, window: Window) -> list[dict[str, Any]]:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return self._client.custom_query_range(
                expr,
                start_time=datetime.fromtimestamp(window.start, UTC),
                end_time=datetime.fromtimestamp(window.end, UTC),
                step=prom_duration(window.step_s),
            )
        except requests.RequestException as exc:
            raise PrometheusUnreachable(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from None
        except PrometheusApiClientException as exc:
            raise QueryFailed(f"query failed: {exc}\n  {expr}") from None


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "No route to host"):
        if marker in text:
            return marker.lower()
    return exc.__class__.__name__


def fetch_panel(
    source: PrometheusSource, panel: Panel, window: Window, variables: dict[str, str]
) -> list[Series]:
    out: list[Series] = []
    if panel.kind == "table":
        return _fetch_bars(source, panel, window, variables)
    for query in panel.queries:
        for item in source.range(substitute(query.expr, variables), window):
            points = item.get("values", [])
            out.append(
                Series(
                    legend(query.legend, item.get("metric", {})),
                    [float(t) for t, _ in points],
                    [float(v) for _, v in points],
                )
            )
    out.sort(key=lambda s: s.label)
    return out


def _fetch_bars(
    source: PrometheusSource, panel: Panel, window: Window, variables: dict[str, str]
) -> list[Series]:
    """A table panel's first query at the window's end, one series per stack label (e.g. worker):
    ``times`` holds the categories (e.g. rank numbers), ``values`` the value of each."""
    category, stack = panel.bars
    per_stack: dict[str, dict[float, float]] = {}
    for item in source.instant(substitute(panel.queries[0].expr, variables), window.end):
        labels = item.get("metric", {})
        try:
            key = float(labels.get(category, "nan"))
        except ValueError:
            continue
        per_stack.setdefault(labels.get(stack, "?"), {})[key] = float(item["value"][1])
    return [
        Series(name, sorted(values), [values[k] for k in sorted(values)])
        for name, values in sorted(per_stack.items())
    ]


def draw_bars(ax: Any, panel: Panel, series: Sequence[Series], window: Window) -> None:
    category, stack = panel.bars
    categories = sorted({c for s in series for c in s.times})
    left = dict.fromkeys(categories, 0.0)
    for s in series:
        widths = [dict(zip(s.times, s.values, strict=True)).get(c, 0.0) for c in categories]
        ax.barh([f"#{c:g}" for c in categories], widths, left=[left[c] for c in categories], label=s.label)
        for c, w in zip(categories, widths, strict=True):
            left[c] += w
    ax.invert_yaxis()
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(f"hits by {stack}, at {datetime.fromtimestamp(window.end, UTC):%H:%M:%S} UTC", fontsize=8)
    ax.set_ylabel(category, fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    ax.tick_params(labelsize=7)
    if series:
        ax.legend(fontsize=7, loc="lower right", title=stack, title_fontsize=7)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


_UNITS = {
    "s": ("seconds", 1.0),
    "percentunit": ("%", 100.0),
    "reqps": ("requests / s", 1.0),
    "ops": ("/ s", 1.0),
}


def draw_panel(ax: Any, panel: Panel, series: Sequence[Series], window: Window) -> None:
    if panel.kind == "table":
        draw_bars(ax, panel, series, window)
        return
    label, scale = _UNITS.get(panel.unit, ("", 1.0))
    t0 = window.start
    span = window.end - window.start
    per, what = (60.0, "minutes") if span > 600 else (1.0, "seconds")
    for s in series:
        xs = [(t - t0) / per for t in s.times]
        ax.plot(xs, [v * scale for v in s.values], label=s.label, linewidth=1.4)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(f"{what} since {datetime.fromtimestamp(t0, UTC):%H:%M:%S} UTC", fontsize=8)
    ax.set_ylabel(label, fontsize=8)
    ax.set_xlim(0, span / per)
    if panel.max is not None:
        ax.set_ylim(0, panel.max * scale * 1.05)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=7)
    if series:
        ax.legend(fontsize=7, loc="best", ncol=2 if len(series) > 4 else 1)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def last_value(s: Series) -> float | None:
    for v in reversed(s.values):
        if not math.isnan(v):
            return v
    return None


def _panel_summary(panel: Panel, series: Sequence[Series]) -> dict[str, Any]:
    out: dict[str, Any] = {"title": panel.title, "unit": panel.unit}
    if panel.kind == "table":  # bars: {stack label: {category: value}} at the window's end
        out["at_end"] = {
            s.label: {f"{c:g}": v for c, v in zip(s.times, s.values, strict=True)} for s in series
        }
    else:
        out["last"] = {s.label: last_value(s) for s in series}
    return out


def write_report(
    source: PrometheusSource,
    out: Path,
    window: Window,
    *,
    fleet: str | None = None,
    namespace: str | None = None,
    panels: Sequence[Panel] | None = None,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [p for p in (panels if panels is not None else PANELS) if p.in_report]
    variables = panel_variables(fleet, namespace, window)
    data = [(p, fetch_panel(source, p, window, variables)) for p in chosen]
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for panel, series in data:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        draw_panel(ax, panel, series, window)
        fig.tight_layout()
        path = out / f"{panel.slug}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    cols = 2
    rows = max(math.ceil(len(data) / cols), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.4 * rows), squeeze=False)
    for i, (panel, series) in enumerate(data):
        draw_panel(axes[i // cols][i % cols], panel, series, window)
    for j in range(len(data), rows * cols):
        axes[j // cols][j % cols].axis("off")
    title = f"prefixfleet — fleet {fleet or 'all'}" + (f" in {namespace}" if namespace else "")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    overview = out / "overview.png"
    fig.savefig(overview, dpi=100)
    plt.close(fig)
    written.append(overview)
    summary = {
        "prometheus": source.url,
        "fleet": fleet,
        "namespace": namespace,
        "start": window.start,
        "end": window.end,
        "step_s": window.step_s,
        "rate_window_s": window.rate_window_s,
        "panels": {p.slug: _panel_summary(p, series) for p, series in data},
    }
    report_json = out / "report.json"
    from prefixfleet.outputs import write_json

    write_json(report_json, summary, "--out")  # Prometheus answers NaN for 0/0 rates: null in JSON
    written.append(report_json)
    return written


# -- CLI -----------------------------------------------------------------------------------------


# The module docstring for --help readers: flags and files, no names from the code.
REPORT_HELP = (
    "The Grafana dashboard's main panels as PNGs, straight from a Prometheus: for users without "
    "Grafana and for the README's pictures. The panels and their queries are the dashboard's own; "
    "--fleet and --namespace fill its variables (as regex matchers) and --rate-window its "
    "$__rate_interval. Each panel becomes OUT/<panel>.png, OUT/overview.png has them all on one page "
    "and OUT/report.json the last value of every series. See docs/observability.md."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="render the dashboard's main panels to PNG from a Prometheus (no Grafana needed)",
        description=REPORT_HELP,
    )
    p.add_argument(
        "--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090"
    )
    p.add_argument("--fleet", help="fleet name (the `fleet` label); default: every fleet")
    p.add_argument("--namespace", help="namespace (the `namespace` label); default: all")
    p.add_argument("--since", default="15m", help="how far back from now, e.g. 15m, 1h, 90s (default 15m)")
    p.add_argument("--until", type=float, default=None, help=argparse.SUPPRESS)  # unix seconds, for tests
    p.add_argument(
        "--rate-window", default=None, help="rate() window ($__rate_interval); default max(1m, 4 steps)"
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for the PNGs")
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from prefixfleet.cli import UsageError
    from prefixfleet.outputs import output_dir, writing

    for flag, value in (("--fleet", args.fleet), ("--namespace", args.namespace)):
        if value is not None and not _NAME.fullmatch(value):
            raise UsageError(f"{flag} must be a Kubernetes-style name, got {value!r}")
    if not args.prometheus.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus must be an http(s) URL, got {args.prometheus!r}")
    flag = "--since"  # the flag being read, so the message names the one that is wrong
    try:
        since = parse_duration(args.since)
        flag = "--rate-window"
        rate = parse_duration(args.rate_window) if args.rate_window else None
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    out = output_dir(args.out, "--out")
    window = Window.last(since, end=args.until, rate_window_s=rate)
    source = PrometheusSource(args.prometheus)
    try:
        source.check()
        with writing(out / "report.json", "--out"):  # and the PNGs beside it
            written = write_report(source, out, window, fleet=args.fleet, namespace=args.namespace)
    except (PrometheusUnreachable, QueryFailed) as exc:
        raise UsageError(str(exc)) from None
    for path in written:
        print(path)
    return 0
