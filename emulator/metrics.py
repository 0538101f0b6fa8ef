"""SGLang-named Prometheus metrics of one emulated engine, on a registry of its own.

Latencies are *modelled* seconds (wall seconds x time-scale), so dashboards read like a real
engine's whatever speed-up a test runs at.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .engine import EngineStats

# Bucket edges (seconds) for LLM latencies: TTFT from a cache hit (~10 ms) to a deep queue (minutes).
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5,
                10, 15, 20, 30, 60, 120)  # fmt: skip
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.5, 0.75, 1, 2, 5)  # fmt: skip
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class MetricsSink(Protocol):
    """What the engine's scheduler loop reports to, whichever API face (and metric names) serves it."""

    def on_prefilled(self, prompt_tokens: int, cached_tokens: int, ttft_s: float) -> None: ...
    def on_tokens(self, count: int) -> None: ...
    def on_inter_token(self, seconds: float) -> None: ...
    def on_finished(self, e2e_s: float) -> None: ...
    def on_aborted(self) -> None: ...
    def set_state(self, stats: EngineStats) -> None: ...
    def render(self) -> bytes: ...


class EngineMetrics:
    """The ``sglang:*`` series with a ``model_name`` label, exposed from a private registry."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ("model_name",)
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        # prometheus_client appends "_total" to counter names on exposition.
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        self.num_running_reqs = gauge("sglang:num_running_reqs", "Requests in prefill or decode.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "Requests waiting to be scheduled.")
        self.num_used_tokens = gauge(
            "sglang:num_used_tokens", "KV pool tokens held by running requests (computed or reserved)."
        )
        self.token_usage = gauge("sglang:token_usage", "Fraction of the KV pool held by running requests.")
        self.cache_hit_rate = gauge(
            "sglang:cache_hit_rate", "Cached / prompt tokens over the last 256 prefilled requests."
        )
        self.gen_throughput = gauge("sglang:gen_throughput", "Generated tokens per second (last 5 s).")
        self.cached_tokens_in_tree = gauge(
            "sglang:radix_cache_tokens", "Tokens held in the radix cache (pinned or evictable)."
        )
        self.prompt_tokens = counter("sglang:prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("sglang:generation_tokens", "Generated tokens.")
        self.cached_tokens = counter("sglang:cached_tokens", "Prompt tokens served from the radix cache.")
        self.num_requests = counter("sglang:num_requests", "Finished requests.")
        self.num_aborted_requests = counter("sglang:num_aborted_requests", "Requests aborted by clients.")
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token.",
            labels,
            registry=reg,
            buckets=TTFT_BUCKETS,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            labels,
            registry=reg,
            buckets=ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Arrival to last token.",
            labels,
            registry=reg,
            buckets=E2E_BUCKETS,
        )
        # Create the labelled series now so every name is exposed (at 0) before the first request.
        for metric in (
            self.num_running_reqs, self.num_queue_reqs, self.num_used_tokens, self.token_usage,
            self.cache_hit_rate, self.gen_throughput, self.cached_tokens_in_tree, self.prompt_tokens,
            self.generation_tokens, self.cached_tokens, self.num_requests, self.num_aborted_requests,
            self.ttft, self.itl, self.e2e,
        ):  # fmt: skip
            self._l(metric)

    def _l(self, metric: Gauge | Counter | Histogram) -> Gauge | Counter | Histogram:
        return metric.labels(model_name=self.model_name)

    def on_prefilled(self, prompt_tokens: int, cached_tokens: int, ttft_s: float) -> None:
        self._l(self.prompt_tokens).inc(prompt_tokens)
        self._l(self.cached_tokens).inc(cached_tokens)
        self._l(self.ttft).observe(ttft_s)

    def on_tokens(self, count: int) -> None:
        if count:
            self._l(self.generation_tokens).inc(count)

    def on_inter_token(self, seconds: float) -> None:
        self._l(self.itl).observe(seconds)

    def on_finished(self, e2e_s: float) -> None:
        self._l(self.num_requests).inc()
        self._l(self.e2e).observe(e2e_s)

    def on_aborted(self) -> None:
        self._l(self.num_aborted_requests).inc()

    def set_state(self, stats: EngineStats) -> None:
        self._l(self.num_running_reqs).set(stats.num_running)
        self._l(self.num_queue_reqs).set(stats.num_waiting)
        self._l(self.num_used_tokens).set(stats.num_used_tokens)
        self._l(self.token_usage).set(stats.token_usage)
        self._l(self.cache_hit_rate).set(stats.cache_hit_rate)
        self._l(self.gen_throughput).set(stats.gen_throughput)
        self._l(self.cached_tokens_in_tree).set(stats.cached_tokens_in_tree)

    def render(self) -> bytes:
        return generate_latest(self.registry)
