"""The dashboard's engine panels and the alerts read vLLM fleets, against a REAL Prometheus.

Like test_observability_live.py, but the engines are stand-ins: threaded ``http.server`` processes on
127.0.0.1 whose ``/metrics`` is vLLM's own exposition (``vllm:*``, labelled ``model_name`` and
``engine`` like vLLM's V1 engine), every counter growing by a fixed step per scrape. Two vLLM replicas
of one fleet and, in the same Prometheus, one SGLang-style replica of another fleet, scraped the way
the chart's PodMonitor labels them (``namespace``, ``fleet``, ``pod``), with the shipped alert rules
loaded. Every dashboard query that reads engine series must return data for the vLLM fleet, the hit
rate and queue depth must be the served numbers (each pod counted once, also with both engines
selected), and the alerts must evaluate on vLLM's series. A missing ``prometheus`` fails the test.
"""

from __future__ import annotations

import itertools
import math
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import yaml
from fleet_fixtures import free_port, serve_http, wait_until

from prefixfleet.observability import dashboard as dash
from prefixfleet.observability.local_prometheus import LocalPrometheus, ScrapeTarget, scrape_config
from prefixfleet.observability.scenario import ALERTS

SCRAPE_S = 0.5
RATE_WINDOW = "5s"  # 10 scrapes
VLLM_FLEET = "vllm-fleet"
SGLANG_FLEET = "sglang-fleet"
NAMESPACE = "local"


@dataclass(frozen=True)
class Engine:
    """What one stand-in engine serves: gauges, and per-scrape growth of its token counters."""

    pod: str
    waiting: int
    running: int
    kv_usage: float
    queries_per_scrape: int  # prompt tokens looked up in the prefix cache
    hits_per_scrape: int  # of those, found cached


VLLM_ENGINES = (
    Engine("vllm-0", waiting=10, running=4, kv_usage=0.5, queries_per_scrape=400, hits_per_scrape=300),
    Engine("vllm-1", waiting=0, running=0, kv_usage=0.1, queries_per_scrape=400, hits_per_scrape=100),
)
SGLANG_ENGINE = Engine(
    "sglang-0", waiting=2, running=1, kv_usage=0.3, queries_per_scrape=200, hits_per_scrape=50
)
TTFT_BUCKETS = (0.01, 0.1, 1.0, 10.0)


def histogram(name: str, labels: str, scrapes: int) -> list[str]:
    # per scrape: 4 first tokens within 10 ms, 4 more within 100 ms, 2 within 1 s
    per_scrape = (4, 8, 10, 10)
    lines = [f"# TYPE {name} histogram"]
    for le, count in zip(TTFT_BUCKETS, per_scrape, strict=True):
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count * scrapes}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {10 * scrapes}')
    lines.append(f"{name}_count{{{labels}}} {10 * scrapes}")
    lines.append(f"{name}_sum{{{labels}}} {0.9 * scrapes}")
    return lines


def vllm_exposition(e: Engine, scrapes: int) -> str:
    labels = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {e.running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {e.waiting}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {e.kv_usage}",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} {e.queries_per_scrape * scrapes}",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {e.hits_per_scrape * scrapes}",
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{labels}}} {e.queries_per_scrape * scrapes}",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{labels}}} {64 * scrapes}",
        *histogram("vllm:time_to_first_token_seconds", labels, scrapes),
    ]
    return "\n".join(lines) + "\n"


def sglang_exposition(e: Engine, scrapes: int) -> str:
    labels = 'model_name="m"'
    lines = [
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{labels}}} {e.running}",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{labels}}} {e.waiting}",
        "# TYPE sglang:token_usage gauge",
        f"sglang:token_usage{{{labels}}} {e.kv_usage}",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{{{labels}}} {e.queries_per_scrape * scrapes}",
        "# TYPE sglang:cached_tokens_total counter",
        f"sglang:cached_tokens_total{{{labels}}} {e.hits_per_scrape * scrapes}",
        *histogram("sglang:time_to_first_token_seconds", labels, scrapes),
    ]
    return "\n".join(lines) + "\n"


def metrics_handler(render: Callable[[int], str]) -> type[BaseHTTPRequestHandler]:
    """An engine's /metrics: ``render(n)`` for the n-th scrape, so counters grow at a fixed step."""
    scrapes = itertools.count(1)
    lock = threading.Lock()

    class MetricsEngine(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            with lock:
                n = next(scrapes)
            body = render(n).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:  # keep pytest's output clean
            pass

    return MetricsEngine


@dataclass(frozen=True)
class Scraped:
    prometheus: LocalPrometheus
    start: float
    end: float

    def api(self, path: str, **params: str) -> dict[str, Any]:
        return self.prometheus.api(path, **params)

    def query_range(self, expr: str) -> dict[str, Any]:
        return self.api("query_range", query=expr, start=f"{self.start}", end=f"{self.end}", step="0.5")

    def at_end(self, expr: str) -> dict[str, float]:
        """Instant query at the end of the run: the value per ``pod`` label ("" when aggregated away)."""
        answer = self.api("query", query=expr, time=f"{self.end}")
        assert answer["status"] == "success", f"{answer.get('error')}\n{expr}"
        return {s["metric"].get("pod", ""): float(s["value"][1]) for s in answer["data"]["result"]}


def variables(fleet: str) -> dict[str, str]:
    return {"namespace": NAMESPACE, "fleet": fleet, "__rate_interval": RATE_WINDOW}


def has_number(result: dict[str, Any]) -> bool:
    return any(
        math.isfinite(float(v)) for series in result["data"]["result"] for _, v in series.get("values", [])
    )


PANEL = {p.title: p for p in dash.PANELS}
HIT_RATE_FLEET = PANEL["Prefix hit rate, fleet (token-weighted)"].queries[0].expr
HIT_RATE_REPLICA = PANEL["Prefix hit rate per replica (token-weighted)"].queries[0].expr
QUEUE_DEPTH = PANEL["Queue depth per replica"].queries[0].expr
ENGINE_QUERIES = [(w, e) for w, e in dash.all_queries() if "vllm:" in e]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    if not shutil.which("prometheus"):
        pytest.fail(
            "prometheus is not on PATH: install Debian's package "
            "(apt-get update && apt-get install -y prometheus; .ci/run does this)"
        )
    with ExitStack() as stack:
        vllm_targets = [
            ScrapeTarget("vllm-replica", stack.enter_context(serve_http(metrics_handler(
                lambda n, e=e: vllm_exposition(e, n)))), e.pod)
            for e in VLLM_ENGINES
        ]  # fmt: skip
        sglang_url = stack.enter_context(
            serve_http(metrics_handler(lambda n: sglang_exposition(SGLANG_ENGINE, n)))
        )
        config = scrape_config(vllm_targets, fleet=VLLM_FLEET, interval_s=SCRAPE_S, rule_files=[ALERTS])
        sglang = scrape_config(
            [ScrapeTarget("sglang-replica", sglang_url, SGLANG_ENGINE.pod)], fleet=SGLANG_FLEET
        )
        config["scrape_configs"] += sglang["scrape_configs"]  # under the first config's 0.5 s interval
        prometheus = LocalPrometheus(tmp_path_factory.mktemp("vllm-prometheus"), free_port(), config)
        stack.enter_context(prometheus)
        start = time.time()

        counters = '{__name__=~"vllm:prefix_cache_hits_total|sglang:cached_tokens_total"}'

        def scrapes_of_every_pod() -> dict[str, float]:
            return Scraped(prometheus, start, time.time()).at_end(
                f"sum by (pod) (count_over_time({counters}[1m]))"
            )

        wait_until(
            scrapes_of_every_pod,
            60.0,
            "12 scrapes of all three stand-in engines (rates over a full window)",
            done=lambda got: len(got) == 3 and min(got.values()) >= 12,
        )
        yield Scraped(prometheus, start, time.time())


@pytest.mark.parametrize(("where", "expr"), ENGINE_QUERIES, ids=[w for w, _ in ENGINE_QUERIES])
def test_every_engine_query_returns_data_for_a_vllm_fleet(scraped: Scraped, where: str, expr: str) -> None:
    concrete = dash.substitute(expr, variables(VLLM_FLEET))
    answer = scraped.query_range(concrete)
    assert answer["status"] == "success", f"{where}: {answer.get('error')}\n{concrete}"
    assert has_number(answer), f"{where} returned no data for the vLLM fleet\n{concrete}"


def test_the_engine_panels_are_the_ones_that_read_vllm() -> None:
    titles = {w for w, _ in ENGINE_QUERIES}
    assert titles == {
        "panel 'Time to first token'",
        "panel 'Prefix hit rate, fleet (token-weighted)'",
        "panel 'Prefix hit rate per replica (token-weighted)'",
        "panel 'Queue depth per replica'",
        "panel 'KV cache usage per replica'",
    }
    for _, expr in dash.all_queries():  # no panel reads an SGLang series without vLLM's
        assert ("sglang:" in expr) == ("vllm:" in expr), expr


def rate_sum(metric: str, fleet: str) -> str:
    return f'sum(rate({metric}{{namespace="{NAMESPACE}", fleet=~"{fleet}"}}[{RATE_WINDOW}]))'


def test_hit_rate_panels_show_vllm_prefix_cache_hits_over_queries(scraped: Scraped) -> None:
    per_replica = scraped.at_end(dash.substitute(HIT_RATE_REPLICA, variables(VLLM_FLEET)))
    assert per_replica == pytest.approx({"vllm-0": 0.75, "vllm-1": 0.25})
    fleet = scraped.at_end(dash.substitute(HIT_RATE_FLEET, variables(VLLM_FLEET)))
    hits_over_queries = scraped.at_end(
        f"{rate_sum('vllm:prefix_cache_hits_total', VLLM_FLEET)}"
        f" / {rate_sum('vllm:prefix_cache_queries_total', VLLM_FLEET)}"
    )
    assert fleet == pytest.approx(hits_over_queries) and 0.25 < fleet[""] < 0.75  # both replicas weigh in


def test_queue_panel_shows_vllm_waiting_requests(scraped: Scraped) -> None:
    assert scraped.at_end(dash.substitute(QUEUE_DEPTH, variables(VLLM_FLEET))) == {
        "vllm-0": 10.0,
        "vllm-1": 0.0,
    }


def test_with_both_engines_selected_every_pod_counts_once(scraped: Scraped) -> None:
    both = variables(".*")
    queue = scraped.at_end(dash.substitute(QUEUE_DEPTH, both))
    assert queue == {"vllm-0": 10.0, "vllm-1": 0.0, "sglang-0": 2.0}
    per_replica = scraped.at_end(dash.substitute(HIT_RATE_REPLICA, both))
    assert per_replica == pytest.approx({"vllm-0": 0.75, "vllm-1": 0.25, "sglang-0": 0.25})
    fleet = scraped.at_end(dash.substitute(HIT_RATE_FLEET, both))
    # token-weighted over all three pods: (vLLM hits + SGLang cached) / (vLLM queries + SGLang prompt)
    pooled = scraped.at_end(
        f"({rate_sum('vllm:prefix_cache_hits_total', '.*')} + {rate_sum('sglang:cached_tokens_total', '.*')})"
        f" / ({rate_sum('vllm:prefix_cache_queries_total', '.*')}"
        f" + {rate_sum('sglang:prompt_tokens_total', '.*')})"
    )
    assert fleet == pytest.approx(pooled)


ALERT_RULES = {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}


def test_alert_rules_are_healthy_on_vllm_series(scraped: Scraped) -> None:
    def evaluated() -> list[dict[str, Any]]:
        return [r for g in scraped.api("rules")["data"]["groups"] for r in g["rules"]]

    rules = wait_until(
        evaluated,
        30.0,
        "every rule evaluated once",
        done=lambda rs: all(r["lastEvaluation"][:4] != "0001" for r in rs),
    )
    assert {r["name"] for r in rules} == set(ALERT_RULES)
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"


def test_hotspot_alert_names_the_deep_vllm_queue_next_to_an_idle_replica(scraped: Scraped) -> None:
    answer = scraped.api(
        "query", query=ALERT_RULES["PrefixfleetReplicaHotspot"]["expr"], time=f"{scraped.end}"
    )
    assert answer["status"] == "success", answer.get("error")
    found = [
        (s["metric"]["fleet"], s["metric"]["pod"], float(s["value"][1])) for s in answer["data"]["result"]
    ]
    assert found == [(VLLM_FLEET, "vllm-0", 10.0)]  # the SGLang fleet's 2 queued stay below 4
