"""The Grafana dashboard of a prefixfleet fleet, as plain data, rendered to the chart's JSON.

One list of panels feeds three consumers: the dashboard JSON shipped in the Helm chart
(``charts/prefixfleet/dashboards/prefixfleet.json``, regenerated with
``python -m prefixfleet.observability.dashboard``; a test fails when the committed file drifts), the
``prefixfleet report`` command (renders the panels marked ``in_report`` to PNG without Grafana) and
the live-Prometheus test (evaluates every query). Queries use three variables: ``$datasource``,
``$namespace`` and ``$fleet`` (Kubernetes namespace and the fleet name; the chart's Service/PodMonitor
copy the pod label ``prefixfleet.io/fleet`` into a ``fleet`` label), plus Grafana's
``$__rate_interval``.

The same command writes the chart's copy of the alert rules, ``files/alerts.yaml``: their source is
this package's ``alerts.yaml`` (package data, so an installed prefixfleet, the image's included,
loads them: the observed-fleet scenario's Prometheus does). Helm reads only files inside the chart
directory, so the chart carries copies of both rather than references; the package holds the
sources because the wheel cannot ship anything from charts/. Installed from a wheel there is no
chart next to the package: ``--chart DIR`` names one, ``--out -`` prints the dashboard JSON.

Series per replica: engine metrics (``sglang:*`` or ``vllm:*``, scraped through the sidecar's port)
carry the scrape target's ``pod`` label; gateway metrics name the replica in their ``worker`` label,
which the operator sets to the pod name, so both read the same.

Engines: a fleet runs SGLang (or the emulator, which exports SGLang's series) or vLLM, and each engine
panel reads both names of its series (:data:`ENGINE_SERIES`). The union is taken on the raw series,
before aggregating: a pod exports one engine's names only, so ``a or b`` keeps every pod once and
the sum over it is the same as over either engine alone, also when the selection mixes SGLang and
vLLM fleets. Histograms are the exception (the two engines' buckets differ, and summing different
bucket layouts makes no histogram): their quantile is computed per engine and then joined with
``or``, so a selection mixing both engines shows SGLang's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The checkout's chart (absent when the package is installed from a wheel).
CHART = Path(__file__).resolve().parents[2] / "charts" / "prefixfleet"
DASHBOARD_FILE = "dashboards/prefixfleet.json"  # inside the chart
DASHBOARD_PATH = CHART / DASHBOARD_FILE
ALERTS = Path(__file__).resolve().with_name("alerts.yaml")  # package data: the alert rules' source
ALERTS_FILE = "files/alerts.yaml"  # the chart's copy, which its PrometheusRule template reads
UID = "prefixfleet-overview"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", fleet=~"$fleet"'
RATE = "$__rate_interval"
VARIABLE_SOURCE = "prefixfleet_gateway_workers"  # a gauge every gateway sets on its first refresh


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False  # table panels: one value per series, at the end of the range


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "table"
    in_report: bool = False  # rendered by `prefixfleet report`
    slug: str = ""  # file name of its PNG in the report
    max: float | None = None
    bars: tuple[str, str] = ("", "")  # table panels in the report: (category label, stack label)


@dataclass(frozen=True, slots=True)
class Annotation:
    name: str
    expr: str
    title: str
    color: str


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    label: str
    query: str  # label_values(metric{selector}, label)
    depends_on: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """One engine measurement under its SGLang name and its vLLM name(s) (newest first)."""

    sglang: str
    vllm: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return (self.sglang, *self.vllm)


# vLLM counts its prefix cache in tokens: queries = prompt tokens looked up, hits = those found cached,
# the same token-weighted ratio as SGLang's cached / prompt tokens. Both usages are fractions (0-1).
CACHED_TOKENS = EngineSeries("sglang:cached_tokens_total", ("vllm:prefix_cache_hits_total",))
PROMPT_TOKENS_ENGINE = EngineSeries("sglang:prompt_tokens_total", ("vllm:prefix_cache_queries_total",))
QUEUE_REQS = EngineSeries("sglang:num_queue_reqs", ("vllm:num_requests_waiting",))
KV_USAGE = EngineSeries("sglang:token_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))
ENGINE_TTFT = EngineSeries("sglang:time_to_first_token_seconds", ("vllm:time_to_first_token_seconds",))
ENGINE_SERIES: tuple[EngineSeries, ...] = (
    CACHED_TOKENS,
    PROMPT_TOKENS_ENGINE,
    QUEUE_REQS,
    KV_USAGE,
    ENGINE_TTFT,
)


def _quantile(q: float, metric: str, by: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le{by}) (rate({metric}_bucket{{{SEL}}}[{RATE}])))"


def _engine_quantile(q: float, series: EngineSeries) -> str:
    # one quantile per engine (their buckets differ); both come out without labels, so `or` keeps one
    return " or ".join(f"({_quantile(q, name)})" for name in series.names)


def _engine_gauges(series: EngineSeries) -> str:
    """Every engine's series of this gauge, as one union of raw series (one name per pod)."""
    return " or ".join(f"{name}{{{SEL}}}" for name in series.names)


def _engine_rates(series: EngineSeries) -> str:
    return " or ".join(f"rate({name}{{{SEL}}}[{RATE}])" for name in series.names)


def _ratio(num: str, den: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({num}{{{SEL}}}[{RATE}])) / sum{grouping} (rate({den}{{{SEL}}}[{RATE}]))"


def _engine_hit_rate(by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    cached, prompt = _engine_rates(CACHED_TOKENS), _engine_rates(PROMPT_TOKENS_ENGINE)
    return f"sum{grouping} ({cached}) / sum{grouping} ({prompt})"


REQUESTS = "prefixfleet_gateway_requests_total"
DECISIONS = "prefixfleet_gateway_routing_decisions_total"
PROMPT_TOKENS = "prefixfleet_gateway_prompt_tokens_total"
MATCHED_TOKENS = "prefixfleet_gateway_matched_tokens_total"
REGENERATE = "python -m prefixfleet.observability.dashboard"
GATEWAY_WORKERS = f"max(sum by (instance) ({VARIABLE_SOURCE}{{{SEL}}}))"

PANELS: tuple[Panel, ...] = (
    Panel(
        "Time to first token",
        "Fleet-wide TTFT: from arrival at a gateway to the first streamed byte (p50, p99), and the engines' "
        "own p99 (queue + prefill; SGLang's or vLLM's time_to_first_token_seconds, SGLang's alone when the "
        "selection mixes fleets of both engines).",
        "s",
        (
            Query(_quantile(0.5, "prefixfleet_gateway_ttft_seconds"), "p50 (gateway)"),
            Query(_quantile(0.99, "prefixfleet_gateway_ttft_seconds"), "p99 (gateway)"),
            Query(_engine_quantile(0.99, ENGINE_TTFT), "p99 (engines)"),
        ),
        in_report=True,
        slug="ttft",
    ),
    Panel(
        "Requests and errors",
        "Requests per second answered by the gateways, by HTTP status; failures by kind; retries.",
        "reqps",
        (
            Query(f"sum by (code) (rate({REQUESTS}{{{SEL}}}[{RATE}]))", "HTTP {{code}}"),
            Query(
                f"sum by (kind) (rate(prefixfleet_gateway_errors_total{{{SEL}}}[{RATE}]))", "error: {{kind}}"
            ),
            Query(f"sum(rate(prefixfleet_gateway_retries_total{{{SEL}}}[{RATE}]))", "retries"),
        ),
        in_report=True,
        slug="requests",
    ),
    Panel(
        "Prefix hit rate, fleet (token-weighted)",
        "Cached prompt tokens / prompt tokens over all replicas: as the engines measured it (SGLang's "
        "cached / prompt tokens, vLLM's prefix-cache hits / queries), and as the gateways estimated it "
        "when routing.",
        "percentunit",
        (
            Query(_engine_hit_rate(), "engines (measured)"),
            Query(
                _ratio(MATCHED_TOKENS, PROMPT_TOKENS),
                "gateways (estimated)",
            ),
        ),
        in_report=True,
        slug="hit-rate-fleet",
        max=1.0,
    ),
    Panel(
        "Prefix hit rate per replica (token-weighted)",
        "Cached / prompt tokens measured by each replica's engine (vLLM: prefix-cache hits / queries).",
        "percentunit",
        (Query(_engine_hit_rate("pod"), "{{pod}}"),),
        in_report=True,
        slug="hit-rate-replica",
        max=1.0,
    ),
    Panel(
        "Matched-token ratio by routing reason",
        "Prompt tokens expected cached on the chosen replica / prompt tokens, per reason the policy gave "
        "(token-weighted).",
        "percentunit",
        (
            Query(
                _ratio(MATCHED_TOKENS, PROMPT_TOKENS, "reason"),
                "{{reason}}",
            ),
        ),
        in_report=True,
        slug="matched-by-reason",
        max=1.0,
    ),
    Panel(
        "Routing decisions by reason",
        "Decisions per second, by policy and reason.",
        "ops",
        (
            Query(
                f"sum by (policy, reason) (rate({DECISIONS}{{{SEL}}}[{RATE}]))",
                "{{policy}}: {{reason}}",
            ),
        ),
    ),
    Panel(
        "Queue depth per replica",
        "Requests waiting in each engine's queue (sglang:num_queue_reqs, vllm:num_requests_waiting).",
        "short",
        (Query(f"sum by (pod) ({_engine_gauges(QUEUE_REQS)})", "{{pod}}"),),
        in_report=True,
        slug="queue-depth",
    ),
    Panel(
        "Load share per replica",
        "Share of the requests the gateways sent to each replica.",
        "percentunit",
        (
            Query(
                f"sum by (worker) (rate(prefixfleet_gateway_worker_routed_requests_total{{{SEL}}}[{RATE}])) "
                f"/ scalar(sum(rate(prefixfleet_gateway_worker_routed_requests_total{{{SEL}}}[{RATE}])))",
                "{{worker}}",
            ),
        ),
        in_report=True,
        slug="load-share",
        max=1.0,
    ),
    Panel(
        "In flight per replica (gateway view)",
        "Requests in flight on each worker as the gateways see it (reported + own unreported sends).",
        "short",
        (Query(f"max by (worker) (prefixfleet_gateway_worker_in_flight{{{SEL}}})", "{{worker}}"),),
    ),
    Panel(
        "KV cache usage per replica",
        "Fraction of each engine's KV pool held by running requests (sglang:token_usage, "
        "vllm:kv_cache_usage_perc, or older vLLM's vllm:gpu_cache_usage_perc).",
        "percentunit",
        (Query(f"max by (pod) ({_engine_gauges(KV_USAGE)})", "{{pod}}"),),
        max=1.0,
    ),
    Panel(
        "Hot subtrees by rank",
        "Hits at the root of the fleet's hottest prefix subtrees (from the workers' summaries; labelled by "
        "rank, never by prompt or hash).",
        "short",
        (Query(f"max by (rank) (prefixfleet_gateway_hot_subtree_hits{{{SEL}}})", "#{{rank}}"),),
        in_report=True,
        slug="hot-subtrees",
    ),
    Panel(
        "Where hot subtrees live",
        "Hits of each of the hottest subtrees on each replica holding it (rank 1 = hottest), and how many "
        "replicas hold it: a hot subtree on a single busy replica is a hotspot.",
        "short",
        (
            Query(
                f"max by (rank, worker) (prefixfleet_gateway_hot_subtree_worker_hits{{{SEL}}})",
                "#{{rank}} on {{worker}}",
                instant=True,
            ),
            Query(
                f"max by (rank) (prefixfleet_gateway_hot_subtree_holders{{{SEL}}})",
                "#{{rank}} holders",
                instant=True,
            ),
        ),
        kind="table",
        in_report=True,
        slug="hot-subtree-placement",
        bars=("rank", "worker"),
    ),
    Panel(
        "Replicas",
        "Workers in the gateways' view, and by state (warming = pre-warming, draining). Scale, pre-warm "
        "and drain events are annotations.",
        "short",
        (
            Query(GATEWAY_WORKERS, "replicas"),
            Query(f"max by (state) (prefixfleet_gateway_workers_in_state{{{SEL}}})", "{{state}}"),
        ),
        in_report=True,
        slug="replicas",
    ),
    Panel(
        "Summary staleness",
        "Age of the newest cache summary each gateway has seen from each replica (worst gateway).",
        "s",
        (Query(f"max by (worker) (prefixfleet_gateway_summary_staleness_seconds{{{SEL}}})", "{{worker}}"),),
        in_report=True,
        slug="staleness",
    ),
    Panel(
        "Gateway decision latency",
        "Time to score the replicas and pick one (tokenizing excluded).",
        "s",
        (
            Query(_quantile(0.5, "prefixfleet_gateway_decision_latency_seconds"), "p50"),
            Query(_quantile(0.99, "prefixfleet_gateway_decision_latency_seconds"), "p99"),
        ),
        in_report=True,
        slug="decision-latency",
    ),
    Panel(
        "Sidecars: engine and Redis reachable",
        "Per replica: 1 while its sidecar reaches the engine (health check) and publishes to Redis. A "
        "replica at 0 drops out of routing or goes stale in the gateways' view.",
        "short",
        (
            Query(f"min by (pod) (prefixfleet_sidecar_engine_up{{{SEL}}})", "{{pod}} engine"),
            Query(f"min by (pod) (prefixfleet_sidecar_redis_up{{{SEL}}})", "{{pod}} redis"),
        ),
        max=1.0,
    ),
    Panel(
        "Gateways: Redis reachable",
        "1 when every gateway's last read of Redis succeeded (routing continues on the last view if not).",
        "short",
        (Query(f"min(prefixfleet_gateway_redis_up{{{SEL}}})", "redis up"),),
        max=1.0,
    ),
)

# Events as annotations, read off the gateways: scale events off their view size, pre-warm and drain
# off the workers' states. The operator does export its decisions (prefixfleet_operator_scale_events_total
# by action, prefixfleet_operator_replicas: operator/autoscale_handlers.py), but Prometheus has them only
# where the chart's operator.metricsPodMonitor scrapes the operator, and the live-Prometheus test's
# scenario runs none (every query here must return data there), so the gateways' series stay the source.
ANNOTATIONS: tuple[Annotation, ...] = (
    Annotation(
        "Scale events",
        # a change of the replica count within the last minute (2 s resolution catches short blips)
        f"changes({GATEWAY_WORKERS}[1m:2s]) > 0",
        "replicas changed",
        "blue",
    ),
    Annotation(
        "Pre-warm",
        f'max(prefixfleet_gateway_workers_in_state{{{SEL}, state="warming"}}) > 0',
        "replica pre-warming",
        "orange",
    ),
    Annotation(
        "Drain",
        f'max(prefixfleet_gateway_workers_in_state{{{SEL}, state="draining"}}) > 0',
        "replica draining",
        "red",
    ),
)

VARIABLES: tuple[Variable, ...] = (
    Variable("namespace", "Namespace", f"label_values({VARIABLE_SOURCE}, namespace)"),
    Variable(
        "fleet", "Fleet", f'label_values({VARIABLE_SOURCE}{{namespace=~"$namespace"}}, fleet)', ("namespace",)
    ),
)

_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>[A-Za-z_][A-Za-z0-9_]*)\)$")


def parse_label_values(query: str) -> tuple[str | None, str]:
    """``label_values(metric{...}, label)`` -> (series selector or None, label name)."""
    m = _LABEL_VALUES.match(query.strip())
    if m is None:
        raise ValueError(f"not a label_values() query: {query!r}")
    return m.group("match"), m.group("label")


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` with ``values[name]`` (longest names first)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def all_queries() -> list[tuple[str, str]]:
    """Every PromQL expression of the dashboard as (where, expr): panels, then annotations."""
    out = [(f"panel {p.title!r}", q.expr) for p in PANELS for q in p.queries]
    out += [(f"annotation {a.name!r}", a.expr) for a in ANNOTATIONS]
    return out


# -- JSON rendering ------------------------------------------------------------------------------


def _panel_json(panel_id: int, panel: Panel, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults.update(min=0, max=panel.max)
    targets = []
    for i, q in enumerate(panel.queries):
        target: dict[str, Any] = {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": q.expr,
            "legendFormat": q.legend,
        }
        if q.instant:
            target.update(instant=True, range=False, format="table")
        targets.append(target)
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": targets,
    }
    if panel.kind == "timeseries":
        out["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        out["options"] = {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]}
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ]
    return out


def _variable_json(v: Variable) -> dict[str, Any]:
    return {
        "name": v.name,
        "type": "query",
        "label": v.label,
        "datasource": DATASOURCE,
        "query": {"query": v.query, "refId": v.name},
        "definition": v.query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",  # also matches series without the label (e.g. a local Prometheus)
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "refresh": 2,
        "hide": 0,
        "sort": 1,
    }


def build_dashboard() -> dict[str, Any]:
    panels = [_panel_json(i + 1, p, (i % 2) * 12, (i // 2) * 8) for i, p in enumerate(PANELS)]
    annotations = [
        {
            "name": a.name,
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": a.color,
            "expr": a.expr,
            "step": "30s",
            "titleFormat": a.title,
            "textFormat": "",
            "useValueForTime": False,
        }
        for a in ANNOTATIONS
    ]
    datasource_var = {
        "name": "datasource",
        "type": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }
    return {
        "uid": UID,
        "title": "prefixfleet / overview",
        "description": "Prefix-cache-aware LLM fleet: TTFT, traffic, prefix hit rate, routing, load, hot "
        "subtrees, replicas and the gateways' view. Generated by prefixfleet.observability.dashboard.",
        "tags": ["prefixfleet", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 2,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [datasource_var, *(_variable_json(v) for v in VARIABLES)]},
        "annotations": {"list": annotations},
        "panels": panels,
    }


def render_json() -> str:
    return json.dumps(build_dashboard(), indent=2, ensure_ascii=False) + "\n"


def chart_files() -> dict[str, str]:
    """What the chart carries from this package, by path inside the chart."""
    return {DASHBOARD_FILE: render_json(), ALERTS_FILE: ALERTS.read_text()}


def _stale(targets: Mapping[Path, str]) -> list[Path]:
    return [path for path, text in targets.items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write (or --check) the chart's Grafana dashboard JSON and its copy of the alert rules."
    )
    parser.add_argument(
        "--chart", type=Path, help="the chart directory (default: charts/prefixfleet of this checkout)"
    )
    parser.add_argument("--out", type=Path, help="write only the dashboard JSON, to this file ('-': stdout)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    if args.out is not None:
        if args.chart is not None:
            parser.error("--out and --chart: give one")
        if str(args.out) == "-":
            if args.check:
                parser.error("--check needs a file: --out FILE or --chart DIR")
            sys.stdout.write(render_json())
            return 0
        targets = {args.out: render_json()}
    else:
        chart = args.chart
        if chart is None:
            if not (CHART / "Chart.yaml").is_file():
                parser.error(
                    f"no chart at {CHART} (prefixfleet is installed, not run from a checkout): pass"
                    " --chart DIR (a prefixfleet chart) or --out FILE / --out - (the dashboard JSON alone)"
                )
            chart = CHART
        elif not (chart / "Chart.yaml").is_file():
            parser.error(f"--chart {chart}: no Chart.yaml there")
        targets = {chart / relative: text for relative, text in chart_files().items()}
    stale = _stale(targets)
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(targets[path])
    written = ", ".join(str(p) for p in stale) or "nothing (up to date)"
    print(f"wrote {written} ({len(PANELS)} panels, {len(ANNOTATIONS)} annotations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
