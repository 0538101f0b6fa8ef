"""Prometheus metrics of one sidecar, appended to its engine's on the sidecar's ``GET /metrics``.

In a pod the engine listens on loopback only and the sidecar's port is the one Prometheus scrapes, so
the sidecar answers ``/metrics`` with the engine's exposition (``sglang:*``) followed by its own
``prefixfleet_sidecar_*`` series. Those are read from the sidecar's state at scrape time by a
collector (nothing is instrumented on the request path). Labels: ``state`` (three values),
``outcome`` (two) and ``route`` (the refused control requests': bounded, see
router.engine_routes.refused_route_label); the replica is named by the scrape target's ``pod`` label,
never by a prompt or hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .control import CONTROL_ROUTES
from .records import WORKER_STATES


class _Tree(Protocol):
    cached_tokens: int
    capacity_tokens: int


class _Mirror(Protocol):
    tree: _Tree
    hot_prefixes: dict


class _Load(Protocol):
    in_flight: int
    queued: int
    prefill_tokens_per_s: float
    completed: int
    failed: int

    def pending_prefill_tokens(self, now: float) -> int: ...


class _State(Protocol):
    mirror: _Mirror
    load: _Load
    state: str
    engine_ok: bool
    redis_ok: bool
    summary_version: int
    control_refused: Mapping[str, int]


class SidecarCollector(Collector):
    """Reads a sidecar's state (``state()`` returns its current :class:`SidecarState`) at scrape time."""

    def __init__(self, state: Callable[[], _State], clock: Callable[[], float] = time.monotonic) -> None:
        self._state = state
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._state()
        p = "prefixfleet_sidecar_"

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(p + name, doc, value=value)

        tree = s.mirror.tree
        yield gauge("mirror_cached_tokens", "Tokens in the mirror of the engine's cache.", tree.cached_tokens)
        yield gauge(
            "mirror_capacity_tokens", "Capacity of the mirror (the engine's pool).", tree.capacity_tokens
        )
        yield gauge("hot_prefixes", "Hot prefixes kept for pre-warming.", len(s.mirror.hot_prefixes))
        yield gauge("in_flight", "Generation requests in flight through this sidecar.", s.load.in_flight)
        yield gauge("queued", "In-flight requests that have not had their first byte yet.", s.load.queued)
        yield gauge(
            "pending_prefill_tokens",
            "Uncached prompt tokens still to prefill (the load record's estimate).",
            s.load.pending_prefill_tokens(self._clock()),
        )
        yield gauge(
            "prefill_tokens_per_second",
            "Measured prefill speed of the engine (uncached tokens per wall-clock second).",
            s.load.prefill_tokens_per_s,
        )
        yield gauge("redis_up", "1 while the last publish to Redis succeeded.", 1.0 if s.redis_ok else 0.0)
        yield gauge("engine_up", "1 while the engine answers its health check.", 1.0 if s.engine_ok else 0.0)
        states = GaugeMetricFamily(p + "state", "1 for the worker's current state.", labels=["state"])
        for name in WORKER_STATES:
            states.add_metric([name], 1.0 if s.state == name else 0.0)
        yield states
        yield CounterMetricFamily(
            p + "summaries_published", "Cache summaries built (the summary version).", value=s.summary_version
        )
        requests = CounterMetricFamily(
            p + "tracked_requests",
            "Generation requests finished, by outcome (ok: the engine prefilled it; failed: an error "
            "answer, the engine failing, or the client leaving before the first token).",
            labels=["outcome"],
        )
        requests.add_metric(["ok"], s.load.completed)
        requests.add_metric(["failed"], s.load.failed)
        yield requests
        refused = CounterMetricFamily(
            p + "control_refused",
            "Requests refused 401 for want of the fleet's control token, by route: a control "
            "route of the sidecar, a known engine admin route, or other.",
            labels=["route"],
        )
        # the control routes from the start (a rate over a series that appears at its first
        # refusal misses that refusal), engine routes as they are refused
        for route, count in sorted({**dict.fromkeys(CONTROL_ROUTES, 0), **s.control_refused}.items()):
            refused.add_metric([route], count)
        yield refused


def sidecar_registry(state: Callable[[], _State]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    return registry


def exposition(engine_text: bytes | None, registry: CollectorRegistry) -> bytes:
    """The engine's text exposition (if it answered) followed by the sidecar's own families."""
    own = generate_latest(registry)
    if not engine_text:
        return own
    return engine_text + (b"" if engine_text.endswith(b"\n") else b"\n") + own


async def fetch_engine_metrics(
    session: aiohttp.ClientSession, engine_url: str, auth: Mapping[str, str] | None = None
) -> bytes | None:
    """The engine's ``/metrics`` in the classic text format, or None if it does not answer;
    ``auth``: the sidecar's own engine credentials (its Authorization header), if any."""
    try:
        async with session.get(
            f"{engine_url}/metrics",
            # never OpenMetrics: its `# EOF` would end our part. Never compressed either: the
            # session does not decompress (it proxies bytes), and prometheus_client's ASGI app
            # (SGLang's /metrics, older vLLM's) gzips for anyone whose Accept-Encoding names gzip,
            # aiohttp's default
            headers={"Accept": "text/plain", "Accept-Encoding": "identity", **(auth or {})},
            timeout=aiohttp.ClientTimeout(total=5),
        ) as resp:
            if resp.status != 200 or resp.headers.get("Content-Encoding", "identity") != "identity":
                return None  # not text we can read (an engine that compresses even so)
            return await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
