"""Every metric the services expose follows the conventions and is in docs/metrics.md.

Reads the real registries (gateway, sidecar, emulated engine, operator), so a metric added without
documentation, with an unbounded label or with the wrong unit fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.emulator.metrics import EngineMetrics
from prefixfleet.operator.autoscale_handlers import OperatorMetrics
from prefixfleet.router.gateway_metrics import GatewayMetrics
from prefixfleet.router.hotspots import HotSubtree
from prefixfleet.router.sidecar import Sidecar, SidecarConfig
from prefixfleet.router.sidecar_metrics import exposition, sidecar_registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
# Labels whose values come from fixed vocabularies or from the fleet's own replica names.
BOUNDED_LABELS = {"endpoint", "code", "kind", "policy", "reason", "worker", "status", "state", "rank"}
BOUNDED_LABELS |= {"model_name", "outcome", "le"}
# The operator's: a custom resource's namespace and name (one series per fleet, removed with it),
# and fixed vocabularies.
BOUNDED_LABELS |= {"namespace", "fleet", "source", "action"}
# The sidecar's refused control requests: a control route, a known engine admin route or "other"
# (router.engine_routes.refused_route_label); not "endpoint", the Prometheus Operator's target label
BOUNDED_LABELS |= {"route"}
FORBIDDEN = re.compile(r"prompt|text|hash|request|token_id|user|tenant|salt", re.IGNORECASE)


def exposed() -> dict[str, tuple[str, set[str], list[float]]]:
    """name -> (type, label names, histogram bucket bounds) over every service's registry."""
    gateway = GatewayMetrics()
    gateway.set_hot_subtrees([HotSubtree(rank=1, tokens=16, hits=1, holders=(("w0", 1),))])
    gateway.worker_routed.labels("w0").inc()
    gateway.requests.labels("/generate", "200").inc()
    for child in (gateway.decisions, gateway.prompt_tokens, gateway.matched_tokens):
        child.labels("queue_aware", "cache_hit").inc()
    for gauge in (gateway.worker_in_flight, gateway.summary_staleness):
        gauge.labels("w0").set(1)
    gateway.workers.labels("routable").set(1)
    gateway.workers_in_state.labels("ready").set(1)
    gateway.duration.labels("/generate").observe(0.1)
    operator = OperatorMetrics()
    for gauge in (
        operator.replicas,
        operator.max_replicas,
        operator.target_ttft,
        operator.unavailable_replicas,
    ):
        gauge.labels("default", "f").set(1)
    operator.engine_metrics_source.labels("default", "f", "scrape").set(1)
    operator.scale_events.labels("default", "f", "scale_up").inc()
    operator.unhealthy_replacements.labels("default", "f", "unready").inc()
    sidecar = Sidecar(SidecarConfig(engine_url="http://127.0.0.1:9", redis_url=None, port=1, worker_id="w0"))
    texts = [
        exposition(None, gateway.registry),
        exposition(None, sidecar_registry(lambda: sidecar.s)),
        EngineMetrics("m").render(),
        exposition(None, operator.registry),
    ]
    out: dict[str, tuple[str, set[str], list[float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            if family.name.endswith("_created"):
                continue  # prometheus_client's start-time companions of counters and histograms
            labels = {k for s in family.samples for k in s.labels}
            bounds = sorted(
                float(s.labels["le"])
                for s in family.samples
                if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
            )
            name = family.name + ("_total" if family.type == "counter" else "")
            out[name] = (family.type, labels, bounds)
    return out


EXPOSED = exposed()


def test_every_exposed_metric_is_documented() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_:]+)` \|", DOC.read_text(), re.MULTILINE))
    missing = sorted(set(EXPOSED) - documented)
    assert not missing, f"add to docs/metrics.md: {missing}"


def test_every_documented_operator_series_is_checked_here() -> None:
    documented = set(re.findall(r"^\| `(prefixfleet_operator_[a-z0-9_]+)` \|", DOC.read_text(), re.MULTILINE))
    assert len(documented) == 7, documented
    assert documented <= set(EXPOSED), sorted(documented - set(EXPOSED))


@pytest.mark.parametrize("name", sorted(EXPOSED))
def test_names_units_and_labels_follow_the_conventions(name: str) -> None:
    kind, labels, bounds = EXPOSED[name]
    assert name.startswith(
        ("prefixfleet_gateway_", "prefixfleet_sidecar_", "prefixfleet_operator_", "sglang:")
    ), name
    if kind == "counter":
        assert name.endswith("_total")
    else:
        assert not name.endswith("_total"), "only counters end in _total"
    assert not re.search(r"_(ms|milliseconds|minutes|percent)\b", name), "base units: seconds, ratios"
    assert labels <= BOUNDED_LABELS, f"unbounded or unknown label on {name}: {labels - BOUNDED_LABELS}"
    assert not any(FORBIDDEN.search(label) for label in labels - {"le"}), labels
    if kind == "histogram" and name.endswith("_seconds"):
        first, last = bounds[0], bounds[-1]
        if "decision" in name:  # routing work: tens of µs to tens of ms
            assert first <= 50e-6 and last >= 0.05
        elif "inter_token" in name:  # decode steps: ms to seconds
            assert first <= 0.005 and last >= 1
        elif "e2e" in name or "duration" in name:  # whole requests: up to many minutes
            assert first <= 0.1 and last >= 120
        else:  # time to first token: a cache hit (ms) to a deep queue (minutes)
            assert first <= 0.01 and last >= 60


def test_a_fresh_gateway_exports_every_error_kind_at_zero() -> None:
    registry: CollectorRegistry = GatewayMetrics().registry
    text = exposition(None, registry).decode()
    for kind in ("bad_request", "no_worker", "upstream", "timeout", "stream_cut"):
        assert f'prefixfleet_gateway_errors_total{{kind="{kind}"}} 0.0' in text
