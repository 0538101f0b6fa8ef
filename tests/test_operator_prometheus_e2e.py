"""The operator's autoscaler reading engine rates from a REAL Prometheus, and falling back without it.

The emulated cluster (API server, real kubectl, the kubelet shim running the engine emulator and its
sidecar), the operator process and Valkey. Specification, for an autoscaled one-replica fleet whose
``spec.prometheus.url`` names a Prometheus that is not running yet:
* every round reads the sidecar's ``/metrics``: ``status.engineMetrics`` is ``scrape`` with the reason
  (cannot connect) and the operator logs the outage once, not once per round;
* once Debian's ``prometheus`` scrapes the pod (labels ``namespace``, ``fleet``, ``pod``, as the
  chart's PodMonitor gives them), the rounds read it: ``status.engineMetrics.source`` becomes
  ``prometheus``, one ``recovered`` line is logged, and the operator's
  ``prefixfleet_operator_engine_metrics_source{source="prometheus"}`` is 1.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fleet_fixtures import free_port
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.observability.local_prometheus import LocalPrometheus, ScrapeTarget, scrape_config
from prefixfleet.operator.planner import observe_pod, pod_url
from tests.k8s.cluster import (
    REPO,
    EmulatedCluster,
    OperatorProcess,
    operator_in_cluster,
    running_redis,
    wait_for,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
FLEET = "watched"
NAMESPACE = "default"
SIDECAR_PORT = 8100
REPLICA_SELECTOR = f"prefixfleet.io/fleet={FLEET},prefixfleet.io/role=replica"


@pytest.fixture
def cluster_with_operator(tmp_path: Path) -> Iterator[tuple[EmulatedCluster, OperatorProcess, str]]:
    if not shutil.which("prometheus"):
        pytest.fail(
            "prometheus is not on PATH: install Debian's package "
            "(apt-get update && apt-get install -y prometheus; .ci/run does this)"
        )
    metrics_port = free_port()
    with (
        running_redis(tmp_path) as redis_url,
        operator_in_cluster(
            tmp_path, redis_url, extra_args=["--metrics-port", str(metrics_port)], log_lines=60
        ) as (cluster, operator),
    ):
        yield cluster, operator, f"http://127.0.0.1:{metrics_port}/metrics"


def fleet_manifest(prometheus_url: str) -> str:
    fleet = yaml.safe_load((REPO / "examples" / "emulator-fleet.yaml").read_text())
    fleet["metadata"]["name"] = FLEET
    fleet["spec"]["replicas"] = 1
    fleet["spec"]["router"] = {"replicas": 0}
    fleet["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 1, "intervalSeconds": 1}
    fleet["spec"]["prometheus"] = {"url": prometheus_url, "rateWindowSeconds": 10}
    return yaml.safe_dump(fleet)


def engine_metrics(cluster: EmulatedCluster) -> dict[str, Any]:
    return (cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}).get("engineMetrics") or {}


def from_source(cluster: EmulatedCluster, source: str) -> dict[str, Any] | None:
    status = engine_metrics(cluster)
    return status if status.get("source") == source else None


def ready_pod(cluster: EmulatedCluster) -> dict[str, Any] | None:
    for pod in cluster.kubectl_json("get", "pods", "-l", REPLICA_SELECTOR)["items"]:
        conditions = (pod.get("status") or {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return pod
    return None


def source_gauge(metrics_url: str) -> dict[str, float]:
    # a bound, not an expectation (was 5 s): the operator answers slowly on a loaded machine
    text = httpx.get(metrics_url, timeout=30).text
    return {
        s.labels["source"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "prefixfleet_operator_engine_metrics_source"
        for s in f.samples
        if s.labels.get("fleet") == FLEET
    }


def test_operator_reads_prometheus_and_falls_back_to_the_sidecars_while_it_is_down(
    cluster_with_operator: tuple[EmulatedCluster, OperatorProcess, str], tmp_path: Path
) -> None:
    cluster, operator, metrics_url = cluster_with_operator
    prometheus_port = free_port()
    prometheus_url = f"http://127.0.0.1:{prometheus_port}"
    cluster.apply(fleet_manifest(prometheus_url))
    pod = wait_for(lambda: ready_pod(cluster), 90, what="the replica to be Ready")

    # Prometheus is not running: the sidecar's /metrics, with the reason
    down = wait_for(lambda: from_source(cluster, "scrape"), 60, what="status.engineMetrics from the scrape")
    assert down["reason"].startswith(f"Prometheus {prometheus_url} unavailable (cannot connect"), down
    wait_for(lambda: source_gauge(metrics_url).get("scrape") == 1.0, 30, what="the source gauge")

    sidecar = pod_url(observe_pod(pod), SIDECAR_PORT)
    assert sidecar is not None
    target = ScrapeTarget("prefixfleet-replica", sidecar, pod["metadata"]["name"])
    config = scrape_config([target], fleet=FLEET, namespace=NAMESPACE, interval_s=0.5)
    (tmp_path / "prometheus").mkdir()
    prometheus = LocalPrometheus(tmp_path / "prometheus", prometheus_port, config)
    prometheus.start()
    try:
        up = wait_for(
            lambda: from_source(cluster, "prometheus"), 60, what="status.engineMetrics from Prometheus"
        )
        assert up["reason"] == f"Prometheus {prometheus_url}: 1 replica(s)"
        wait_for(lambda: source_gauge(metrics_url).get("prometheus") == 1.0, 30, what="the source gauge")
        assert source_gauge(metrics_url)["scrape"] == 0.0
    finally:
        prometheus.stop()

    log = operator.log_path.read_text(errors="replace")
    outage = [line for line in log.splitlines() if "engine metrics:" in line and "recovered" not in line]
    recovered = [line for line in log.splitlines() if "engine metrics: recovered" in line]
    assert len(outage) == 1, outage  # many rounds ran meanwhile: one warning for the whole outage
    assert "unavailable" in outage[0]
    assert len(recovered) == 1, recovered
