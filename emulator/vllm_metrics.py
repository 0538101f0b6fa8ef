"""vLLM-named Prometheus metrics of one emulated engine (its vLLM face), on a registry of its own.

Names, types and labels as vLLM's PrometheusStatLogger (``vllm/v1/metrics/loggers.py`` in the stored
source): every series is labelled ``model_name`` and ``engine`` ("0": one engine core);
``vllm:request_success_total`` also ``finished_reason``; ``vllm:cache_config_info`` is a gauge set to 1
whose labels are the cache config (CacheConfig.metrics_info(): every field as a string) plus
``engine``. Prefix-cache queries and hits count tokens. Latencies are modelled seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .engine import EngineStats

# vLLM's bucket edges (loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ENGINE_INDEX = "0"
FINISHED_REASON = "length"  # the emulator has no EOS: every request stops at its max_tokens


def cache_config_labels(block_size: int, num_gpu_blocks: int) -> dict[str, str]:
    """The labels of vllm:cache_config_info: str() of the CacheConfig fields that describe this engine
    (vLLM exports every field; the rest are GPU details an emulator has none of)."""
    return {
        "block_size": str(block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9",
        "num_cpu_blocks": "0",
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "engine": ENGINE_INDEX,
    }


class VllmMetrics:
    """The ``vllm:*`` series the engine loop feeds (the same calls as SGLang's EngineMetrics)."""

    def __init__(self, model_name: str, block_size: int, num_gpu_blocks: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        labels = ("model_name", "engine")
        self._values = (model_name, ENGINE_INDEX)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def counter(name: str, doc: str) -> Counter:  # exposed with "_total" appended
            return Counter(name, doc, labels, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=reg, buckets=buckets)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=reg,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        info_labels = cache_config_labels(block_size, num_gpu_blocks)
        self.cache_config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(info_labels),
            registry=reg,
        )
        self.cache_config_info.labels(**info_labels).set(1)
        # Every labelled series exists (at 0) before the first request, as vLLM's make_per_engine
        # does; the engine loop feeds these children, so its per-token calls skip labels()' lookup.
        v = self._values
        self._running = self.running.labels(*v)
        self._waiting = self.waiting.labels(*v)
        self._kv_usage = self.kv_usage.labels(*v)
        self._queries = self.queries.labels(*v)
        self._hits = self.hits.labels(*v)
        self._prompt_tokens = self.prompt_tokens.labels(*v)
        self._generation_tokens = self.generation_tokens.labels(*v)
        self._ttft = self.ttft.labels(*v)
        self._tpot = self.tpot.labels(*v)
        self._e2e = self.e2e.labels(*v)
        self._success = self.success.labels(*v, FINISHED_REASON)

    def on_prefilled(self, prompt_tokens: int, cached_tokens: int, ttft_s: float) -> None:
        # vLLM counts a lookup's queried tokens (the prompt) and its hit (whole cached blocks)
        self._queries.inc(prompt_tokens)
        self._hits.inc(cached_tokens)
        self._prompt_tokens.inc(prompt_tokens)
        self._ttft.observe(ttft_s)

    def on_tokens(self, count: int) -> None:
        if count:
            self._generation_tokens.inc(count)

    def on_inter_token(self, seconds: float) -> None:
        self._tpot.observe(seconds)

    def on_finished(self, e2e_s: float) -> None:
        self._success.inc()
        self._e2e.observe(e2e_s)

    def on_aborted(self) -> None:
        pass  # not counted: how vLLM counts a client's abort in request_success was not checked

    def set_state(self, stats: EngineStats) -> None:
        self._running.set(stats.num_running)
        self._waiting.set(stats.num_waiting)
        self._kv_usage.set(stats.token_usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)
