"""Prometheus metrics of one gateway (a registry per app: several gateways can share a process)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# LLM-sized: first tokens arrive in tens of ms to tens of seconds
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DECISION_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1)
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        p = "prefixfleet_gateway_"
        self.requests = Counter(
            p + "requests",
            "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "code"],
            registry=r,
        )
        self.errors = Counter(
            p + "errors", "Failures, by kind (bad_request, no_worker, upstream, ...).", ["kind"], registry=r
        )
        self.retries = Counter(
            p + "retries", "Requests re-sent to another worker after a failure.", registry=r
        )
        self.decisions = Counter(
            p + "routing_decisions",
            "Routing decisions, by policy and reason.",
            ["policy", "reason"],
            registry=r,
        )
        self.matched_ratio = Histogram(
            p + "matched_token_ratio",
            "Share of a request's prompt tokens cached on the chosen worker (as the gateway estimated it).",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.worker_in_flight = Gauge(
            p + "worker_in_flight",
            "Requests in flight per worker (reported + this gateway's unreported).",
            ["worker"],
            registry=r,
        )
        self.summary_staleness = Gauge(
            p + "summary_staleness_seconds",
            "Age of the newest cache summary seen from each worker.",
            ["worker"],
            registry=r,
        )
        self.workers = Gauge(p + "workers", "Workers in the view, by routability.", ["status"], registry=r)
        self.decision_latency = Histogram(
            p + "decision_latency_seconds",
            "Time to pick a worker (tokenize excluded).",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Time from request arrival to the first streamed byte sent to the client.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Time from request arrival to the last byte sent, by endpoint.",
            ["endpoint"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.redis_up = Gauge(p + "redis_up", "1 when the last read of Redis succeeded.", registry=r)

    def forget_worker(self, worker: str) -> None:
        for gauge in (self.worker_in_flight, self.summary_staleness):
            with contextlib.suppress(KeyError):
                gauge.remove(worker)
