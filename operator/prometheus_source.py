"""Engine rates for the autoscaler from Prometheus, one value per replica pod (prometheus-api-client).

With ``W`` the rate window (``spec.prometheus.rateWindowSeconds``) and ``S`` the fleet's label
matchers (``spec.prometheus.matchLabels``, default ``namespace="<ns>",fleet="<fleet>"``), the three
queries are::

    sum by (pod) (rate(sglang:prompt_tokens_total{S}[Ws]))
    sum by (pod) (rate(sglang:cached_tokens_total{S}[Ws]))
    sum by (pod) (sglang:num_queue_reqs{S})

(for vLLM, ``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total`` and
``vllm:num_requests_waiting``, also from an emulator run with ``--api vllm``:
``autoscale_observe.engine_metric_names``). ``pod`` is
``spec.prometheus.podLabel``. Those are the labels the chart's PodMonitor gives a replica's
series (the Prometheus Operator sets ``namespace`` and ``pod``, the monitor's relabeling copies the pod
label ``prefixfleet.io/fleet`` into ``fleet``) and the ones
:mod:`prefixfleet.observability.local_prometheus` gives a local fleet. ``rate`` before ``sum``: an
engine restart resets its counter without a negative step.

The query builders and the result decoding are pure; :class:`PrometheusSource` is the I/O shell.
PrometheusConnect is synchronous (requests), so its calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from prefixfleet.router.addresses import host_for_url

from .autoscale_observe import SGLANG_METRICS, EngineMetricNames, EngineRates, engine_metric_names
from .models import EngineKind, PrometheusSpec

QUERY_TIMEOUT_S = 2.0  # a round must not wait long on a sick Prometheus: the scrape is the fallback


@dataclass(frozen=True, slots=True)
class PrometheusScope:
    """Which series belong to one fleet, and over which window to rate them."""

    matchers: tuple[tuple[str, str], ...]
    window_s: int = 60
    pod_label: str = "pod"
    metrics: EngineMetricNames = SGLANG_METRICS  # the engine kind's series


def fleet_scope(
    spec: PrometheusSpec,
    namespace: str,
    fleet: str,
    engine_kind: EngineKind = "sglang",
    engine_args: Sequence[str] = (),
) -> PrometheusScope:
    labels = spec.match_labels if spec.match_labels is not None else {"namespace": namespace, "fleet": fleet}
    metrics = engine_metric_names(engine_kind, engine_args)  # the engine's API's series (spec.engine.args)
    return PrometheusScope(tuple(sorted(labels.items())), spec.rate_window_seconds, spec.pod_label, metrics)


def prometheus_url(spec: PrometheusSpec, operator_default: str = "") -> str | None:
    """The fleet's own URL, else the operator's default (``--prometheus``), else None (scrape)."""
    return spec.url or operator_default or None


def label_selector(matchers: Sequence[tuple[str, str]]) -> str:
    # PromQL strings take Go escapes; JSON's are a subset of them.
    return "{" + ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in matchers) + "}"


def engine_queries(scope: PrometheusScope) -> dict[str, str]:
    sel, by, names = label_selector(scope.matchers), scope.pod_label, scope.metrics
    window = f"{scope.window_s}s"
    return {
        "prompt": f"sum by ({by}) (rate({names.prompt_tokens}{sel}[{window}]))",
        "cached": f"sum by ({by}) (rate({names.cached_tokens}{sel}[{window}]))",
        "queue": f"sum by ({by}) ({names.queue_reqs}{sel})",
    }


def values_by_pod(result: Sequence[Mapping[str, Any]], pod_label: str) -> dict[str, float]:
    """An instant vector as {pod: value}; series without the pod label or with a non-finite value
    are dropped."""
    out: dict[str, float] = {}
    for series in result:
        pod = (series.get("metric") or {}).get(pod_label)
        value = series.get("value") or ()
        if not pod or len(value) != 2:
            continue
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[pod] = number
    return out


def rates_by_pod(
    prompt: Mapping[str, float], cached: Mapping[str, float], queue: Mapping[str, float]
) -> dict[str, EngineRates]:
    """A pod counts as covered only with both token rates (a new pod has none until two scrapes)."""
    return {
        pod: EngineRates(rate, cached[pod], queue.get(pod)) for pod, rate in prompt.items() if pod in cached
    }


class PrometheusUnavailable(Exception):
    """Prometheus did not answer the queries; ``str()`` is a short reason for logs and status."""


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, requests.Timeout):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, requests.ConnectionError):
        found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(exc))
        return f"cannot connect: {found.group(1).strip() if found else type(exc).__name__}"
    if isinstance(exc, PrometheusApiClientException):
        return str(exc)[:200]
    return f"unexpected answer: {type(exc).__name__}: {str(exc)[:160]}"


class PrometheusSource:
    """One Prometheus server; ``engine_rates`` answers per fleet scope. ``close()`` releases its
    connections."""

    def __init__(self, url: str, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # No retries: the next round (seconds later) is the retry, and the scrape covers this one.
        self._client = PrometheusConnect(url=self.url, retry=Retry(total=0), timeout=timeout_s)  # type: ignore[arg-type]

    @property
    def display_url(self) -> str:
        """The URL without user:password, for logs and the fleet's status."""
        parts = urlsplit(self.url)
        if parts.username is None and parts.password is None:
            return self.url
        host = host_for_url(parts.hostname or "")  # urlsplit drops an IPv6 address's brackets
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))

    def _query_all(self, queries: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
        return {key: self._client.custom_query(query) for key, query in queries.items()}

    async def engine_rates(self, scope: PrometheusScope) -> dict[str, EngineRates]:
        """Per-pod rates of the scope's engines; raises :class:`PrometheusUnavailable`."""
        try:
            answers = await asyncio.to_thread(self._query_all, engine_queries(scope))
            values = {key: values_by_pod(result, scope.pod_label) for key, result in answers.items()}
        except (requests.RequestException, PrometheusApiClientException, ValueError, KeyError, TypeError,
                AttributeError) as exc:  # fmt: skip
            raise PrometheusUnavailable(describe_failure(exc, self.timeout_s)) from None
        return rates_by_pod(values["prompt"], values["cached"], values["queue"])

    def close(self) -> None:
        self._client.close()
