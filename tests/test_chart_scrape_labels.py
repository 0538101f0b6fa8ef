"""The labels docs/metrics.md documents are the labels Prometheus stores when the chart's monitors scrape.

The Prometheus Operator gives every target of a ServiceMonitor / PodMonitor endpoint the labels
``namespace``, ``service``, ``pod``, ``container``, ``job`` and ``endpoint`` (the port's name; its
generated relabel_configs, e.g. ``target_label: endpoint, replacement: <port>``). Without
``honorLabels``, Prometheus renames a scraped label that collides with a target label to
``exported_<name>``: the gateway's ``endpoint`` label (the request path, on
``prefixfleet_gateway_requests_total`` and ``_request_duration_seconds``) was stored as
``exported_endpoint``, so a query by ``endpoint="/generate"`` (as docs/metrics.md reads) found
nothing. Specification: a real Prometheus, scraping the gateway's and a replica's real exposition
with the target labels the Prometheus Operator sets and the rendered monitor's own relabelings,
stores every series under its documented label names, none renamed ``exported_*``.
"""

from __future__ import annotations

import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import helm_python
import pytest
from chart_fixtures import CHART, render
from fleet_fixtures import free_port, serve_http, wait_until

from prefixfleet.observability.local_prometheus import LocalPrometheus, prometheus_binary
from prefixfleet.router.gateway_metrics import GatewayMetrics
from prefixfleet.router.sidecar import Sidecar, SidecarConfig
from prefixfleet.router.sidecar_metrics import exposition, sidecar_registry

EMULATOR_TEXT = (  # a replica's engine series as the sidecar passes them on (model_name only)
    b'# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name="m"} 2.0\n'
)


def gateway_exposition() -> bytes:
    metrics = GatewayMetrics()
    metrics.requests.labels("/generate", "200").inc()
    metrics.duration.labels("/v1/completions").observe(0.2)
    metrics.worker_routed.labels("replica-0").inc()
    return exposition(None, metrics.registry)


def replica_exposition() -> bytes:
    sidecar = Sidecar(SidecarConfig(engine_url="http://127.0.0.1:9", redis_url=None, port=1, worker_id="w0"))
    return exposition(EMULATOR_TEXT, sidecar_registry(lambda: sidecar.s))


def handler_for(text: bytes) -> type[BaseHTTPRequestHandler]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *_: Any) -> None:
            pass

    return Metrics


def snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def prometheus_relabelings(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A monitor's (meta) relabelings as Prometheus config: the operator renames the keys, nothing else."""
    return [{snake(k): v for k, v in rule.items()} for rule in rules]


def scrape_job(
    name: str, url: str, endpoint: dict[str, Any], target_labels: dict[str, str]
) -> dict[str, Any]:
    """What the Prometheus Operator generates for one monitor endpoint, on a static target: its target
    labels (``endpoint`` = the port's name), no honor_labels, the endpoint's metricRelabelings. The
    monitor's relabelings read Kubernetes service-discovery labels a static target lacks; ``fleet``,
    which they set, is given directly."""
    return {
        "job_name": name,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint["path"],
        "static_configs": [
            {
                "targets": [url.removeprefix("http://")],
                "labels": {**target_labels, "endpoint": endpoint["port"], "fleet": "chat"},
            }
        ],
        "metric_relabel_configs": prometheus_relabelings(endpoint.get("metricRelabelings", [])),
    }


@pytest.fixture(scope="module")
def monitors() -> dict[str, dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        objects = render(chart, {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    return {o["kind"]: o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")}


def stored_series(tmp_path: Path, jobs: list[dict[str, Any]], prefixes: str) -> list[dict[str, str]]:
    prometheus_binary()  # a clear failure when Debian's prometheus is missing
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": jobs}
    query = f'{{__name__=~"{prefixes}"}}'
    with LocalPrometheus(tmp_path, free_port(), config) as prometheus:

        def answer() -> list[dict[str, Any]]:
            return prometheus.api("query", query=query)["data"]["result"]

        wait_until(
            answer,
            60,
            "the scraped series in Prometheus",
            done=lambda result: {s["metric"]["job"] for s in result} == {j["job_name"] for j in jobs},
        )
        return [s["metric"] for s in answer()]


def test_scraped_series_keep_their_documented_label_names(
    monitors: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    (gateways,) = monitors["ServiceMonitor"]["spec"]["endpoints"]
    (replicas,) = monitors["PodMonitor"]["spec"]["podMetricsEndpoints"]
    common = {"namespace": "team-a", "container": "x"}
    with (
        serve_http(handler_for(gateway_exposition())) as gateway_url,
        serve_http(handler_for(replica_exposition())) as replica_url,
    ):
        jobs = [
            scrape_job(
                "chat-router", gateway_url, gateways, {**common, "service": "chat-router", "pod": "g-1"}
            ),
            scrape_job("team-a/prefixfleet-replicas", replica_url, replicas, {**common, "pod": "replica-0"}),
        ]
        series = stored_series(tmp_path, jobs, "prefixfleet_.*|sglang:.*")
    renamed = sorted({k for s in series for k in s if k.startswith("exported_")})
    assert renamed == [], f"scraped labels renamed by Prometheus: {renamed}"
    requests = [s for s in series if s["__name__"] == "prefixfleet_gateway_requests_total"]
    assert [(s["endpoint"], s["code"]) for s in requests] == [("/generate", "200")]
    durations = {
        s["endpoint"] for s in series if s["__name__"].startswith("prefixfleet_gateway_request_duration")
    }
    assert durations == {"/v1/completions"}
    # the series the dashboard, the alerts and the autoscaler select on keep their target labels
    (queue,) = [s for s in series if s["__name__"] == "sglang:num_queue_reqs"]
    assert (queue["namespace"], queue["fleet"], queue["pod"]) == ("team-a", "chat", "replica-0")
    routed = [s for s in series if s["__name__"] == "prefixfleet_gateway_worker_routed_requests_total"]
    assert [(s["worker"], s["namespace"], s["fleet"], s["pod"]) for s in routed] == [
        ("replica-0", "team-a", "chat", "g-1")
    ]
