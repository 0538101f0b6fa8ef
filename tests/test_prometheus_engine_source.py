"""Where the autoscaler's engine numbers come from: a REAL Prometheus, with the sidecars as fallback.

Specification:
* with Prometheus (Debian's ``prometheus``, scraping a live local fleet every 0.5 s with the labels
  the chart's PodMonitor gives: ``namespace``, ``fleet``, ``pod``), the source returns per replica the
  prompt and cached token rates that match what each engine served (within the extrapolation of
  ``rate()``), and the queue; the planner's prefill load is the uncached rate over the prefill speed;
* another fleet's labels select nothing: the round falls back to the sidecars and says so;
* a Prometheus URL on a closed port: every round reads the sidecars' ``/metrics`` instead, the
  planner still gets rates, and the outage is ONE warning, not one per round;
* a malformed ``spec.prometheus.url`` is refused by the models and by the CRD, naming the field;
  bad ``--prometheus`` flags are one-line errors.
A missing ``prometheus`` binary fails (not skips) the live test: .ci/run installs it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from fleet_fixtures import eventually, free_port

from prefixfleet.fleet.autoscale import LOCAL_NAMESPACE, FleetPrometheus, LocalAutoscaler
from prefixfleet.fleet.local import EngineSettings, FleetSpec, LocalFleet
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.observability.local_prometheus import LocalPrometheus, ScrapeTarget, scrape_config
from prefixfleet.operator import models
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.operator.autoscale_observe import EngineRates, EngineReading, engine_reading, outage_notice
from prefixfleet.operator.autoscale_sources import read_engine_metrics, read_records
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import admission_errors
from prefixfleet.operator.prometheus_source import (
    PrometheusScope,
    PrometheusSource,
    engine_queries,
    fleet_scope,
    prometheus_url,
    values_by_pod,
)
from prefixfleet.router.keys import FleetKeys

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
SCRAPE_S = 0.5
BASELINE_SCRAPES = 10
WINDOW_S = 60  # longer than the whole test: every sample of each series is inside it
PREFIX = "The shared system prompt of the metrics test tenant, repeated to make a long prefix. " * 20
ENGINE = EngineSettings(time_scale=10.0, cache_tokens=50_000)
POLL_S = 0.2  # between reads of Prometheus' answers while waiting for them


async def serve(http: httpx.AsyncClient, sidecar: str, requests: int, tag: str) -> tuple[int, int]:
    """Send ``requests`` prompts sharing PREFIX to one replica; (prompt, cached) tokens it reported."""
    prompt = cached = 0
    for i in range(requests):
        body = {"text": f"{PREFIX}{tag} question {i}", "sampling_params": {"max_new_tokens": 2}}
        resp = await http.post(f"{sidecar}/generate", json=body)
        assert resp.status_code == 200, resp.text
        meta = resp.json()["meta_info"]
        prompt += meta["prompt_tokens"]
        cached += meta["cached_tokens"]
    return prompt, cached


def prometheus_for(fleet: LocalFleet, directory: Path) -> LocalPrometheus:
    targets = [
        ScrapeTarget("prefixfleet-replica", r.sidecar_url, r.worker_id)
        for r in fleet.replicas
        if r.sidecar_url
    ]
    config = scrape_config(
        targets, fleet=fleet.spec.fleet_name, namespace=LOCAL_NAMESPACE, interval_s=SCRAPE_S
    )
    directory.mkdir(parents=True, exist_ok=True)
    return LocalPrometheus(directory, free_port(), config)


def require_prometheus() -> None:
    if not shutil.which("prometheus"):
        pytest.fail(
            "prometheus is not on PATH: install Debian's package "
            "(apt-get update && apt-get install -y prometheus; .ci/run does this)"
        )


# ------------------------------------------------------------------ a live fleet and a real Prometheus


async def test_prometheus_rates_match_what_each_engine_served(tmp_path: Path) -> None:
    require_prometheus()
    async with Supervisor(tmp_path / "fleet") as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=2, gateways=0, engine=ENGINE, fleet_name="measured"))
        await fleet.start_engines()
        names = [r.worker_id for r in fleet.replicas]
        urls = {r.worker_id: r.sidecar_url for r in fleet.replicas if r.sidecar_url}
        prometheus = prometheus_for(fleet, tmp_path / "prometheus")
        source = PrometheusSource(prometheus.url)
        scope = PrometheusScope((("fleet", "measured"), ("namespace", LOCAL_NAMESPACE)), WINDOW_S)
        raw = source._client  # the same client, for the raw series the test waits on
        try:
            await asyncio.to_thread(prometheus.start)

            async def scraped(totals: dict[str, float]) -> bool:
                series = await asyncio.to_thread(
                    raw.custom_query, 'sglang:prompt_tokens_total{fleet="measured"}'
                )
                return values_by_pod(series, "pod") == totals

            async def zeros_scraped() -> bool:
                series = await asyncio.to_thread(
                    raw.custom_query,
                    f'count_over_time(sglang:prompt_tokens_total{{fleet="measured"}}[{WINDOW_S}s])',
                )
                counts = values_by_pod(series, "pod")
                return set(counts) == set(names) and min(counts.values()) >= BASELINE_SCRAPES

            # several zeros of each counter before the first request: rate()'s extrapolation to the
            # window's end (at most ~one scrape interval) stays small next to the sampled span
            await eventually(
                lambda: scraped(dict.fromkeys(names, 0.0)), 20, "the first scrape", interval=POLL_S
            )
            await eventually(
                zeros_scraped, 30, f"{BASELINE_SCRAPES} scrapes before the load", interval=POLL_S
            )
            async with httpx.AsyncClient(timeout=30) as http:
                served = {
                    names[0]: await serve(http, urls[names[0]], 12, "busy"),
                    names[1]: await serve(http, urls[names[1]], 4, "calm"),
                }
                await eventually(
                    lambda: scraped({n: float(p) for n, (p, _) in served.items()}),
                    20,
                    "the last scrape",
                    interval=POLL_S,
                )
                rates = await source.engine_rates(scope)

                assert set(rates) == set(names)
                for name, (prompt, cached) in served.items():
                    r = rates[name]
                    # rate() * window is the increase, extrapolated by at most ~one scrape at the end
                    assert prompt <= r.prompt_tokens_per_s * WINDOW_S * 1.001 <= prompt * 1.25, (name, r)
                    assert cached <= r.cached_tokens_per_s * WINDOW_S * 1.001 <= cached * 1.25, (name, r)
                    assert r.queue_reqs == 0  # everything was served
                    assert 0 < cached < prompt  # the prefix was a hit after the first request
                busy, calm = rates[names[0]], rates[names[1]]
                assert busy.prompt_tokens_per_s > 2 * calm.prompt_tokens_per_s

                # the round's reading: all from Prometheus, and the planner's prefill load from it
                redis = aioredis.from_url(fleet.redis_url)
                try:
                    loads, _ = await read_records(redis, FleetKeys("measured"), names)
                finally:
                    await redis.aclose()
                reading = await read_engine_metrics(http, urls, {}, source, scope)
                assert reading.source == "prometheus" and not reading.degraded, reading.reason
                assert reading.counters == {}  # no sidecar was scraped
                for name, load in reading.prefill_loads(loads).items():
                    speed = loads[name].prefill_tokens_per_s
                    assert speed > 0 and load == pytest.approx(
                        reading.rates[name].uncached_tokens_per_s / speed
                    )
                    assert load > 0

                # another fleet's labels select nothing: the sidecars answer, the status says why
                other = PrometheusScope((("fleet", "someone-else"), ("namespace", LOCAL_NAMESPACE)), WINDOW_S)
                assert await source.engine_rates(other) == {}
                fallback = await read_engine_metrics(http, urls, {}, source, other)
                assert fallback.source == "scrape" and fallback.degraded
                assert "no engine series" in fallback.reason and set(fallback.counters) == set(names)
        finally:
            source.close()
            await asyncio.to_thread(prometheus.stop)


async def test_closed_port_falls_back_to_the_sidecars_and_warns_once(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=2, gateways=0, engine=ENGINE, fleet_name="blind"))
        await fleet.start_engines()
        policy = ScalePolicy(min_replicas=2, max_replicas=2)  # this test is about observing only
        autoscaler = LocalAutoscaler(fleet, policy, prometheus_url=closed)
        busy = fleet.replicas[0]
        assert busy.sidecar_url is not None
        redis = aioredis.from_url(fleet.redis_url)
        source = PrometheusSource(closed)
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                readings: list[EngineReading] = []
                for round_no in range(4):
                    await serve(http, busy.sidecar_url, 3, f"round{round_no}")
                    await autoscaler.round(redis, http, source)
                    assert autoscaler.engines is not None
                    readings.append(autoscaler.engines)
        finally:
            source.close()
            await redis.aclose()
    for reading in readings:
        assert reading.source == "scrape" and reading.degraded
        assert reading.reason.startswith(f"Prometheus {closed} unavailable (cannot connect")
        assert set(reading.counters) == {"replica-0", "replica-1"}
    # from the second round on the planner has rates: counters grew between two scrapes
    assert all(r.rates[busy.worker_id].prompt_tokens_per_s > 0 for r in readings[1:])
    assert all(r.rates["replica-1"].prompt_tokens_per_s == 0 for r in readings[1:])
    warnings = [e for e in autoscaler.events if e.action == "engine_metrics"]
    assert len(warnings) == 1, autoscaler.events
    assert "unavailable" in warnings[0].detail


async def test_a_local_prometheus_follows_the_fleet_and_feeds_the_autoscaler(tmp_path: Path) -> None:
    """``prefixfleet up --autoscale --prometheus local``: its targets follow scale-downs (and ups)."""
    require_prometheus()
    async with Supervisor(tmp_path / "fleet") as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=2, gateways=0, engine=ENGINE))
        await fleet.start_engines()
        local = FleetPrometheus(fleet, tmp_path / "prometheus", free_port(), interval_s=SCRAPE_S)
        autoscaler = LocalAutoscaler(
            fleet, ScalePolicy(min_replicas=1, max_replicas=2), prometheus_url=local.url
        )
        source = PrometheusSource(local.url)

        async def scraped_pods() -> set[str]:
            async with httpx.AsyncClient(timeout=5) as http:
                answer = (await http.get(f"{local.url}/api/v1/targets", params={"state": "active"})).json()
            return {t["labels"]["pod"] for t in answer["data"]["activeTargets"] if t["health"] == "up"}

        try:
            await local.start()
            assert not await local.follow()  # nothing changed yet
            await eventually(
                lambda: scraped_pods_are(scraped_pods, {"replica-0", "replica-1"}),
                20,
                "both up",
                interval=POLL_S,
            )
            gone = fleet.replicas.pop()  # as the autoscaler's drain does: stop, then forget
            assert gone.sidecar is not None
            await sup.stop(gone.sidecar)
            await sup.stop(gone.engine)
            assert await local.follow()
            await eventually(
                lambda: scraped_pods_are(scraped_pods, {"replica-0"}), 20, "the reload", interval=POLL_S
            )

            survivor = fleet.replicas[0]
            assert survivor.sidecar_url is not None
            urls = {survivor.worker_id: survivor.sidecar_url}
            async with httpx.AsyncClient(timeout=30) as http:
                await serve(http, survivor.sidecar_url, 3, "local")

                async def from_prometheus() -> EngineReading | None:
                    reading = await autoscaler.read_engines(http, urls, source)
                    served = reading.rates.get(survivor.worker_id, EngineRates(0.0, 0.0)).prompt_tokens_per_s
                    return reading if reading.source == "prometheus" and served > 0 else None

                reading = await eventually(
                    from_prometheus, 30, "the served tokens in the local Prometheus", interval=POLL_S
                )
            assert reading.reason == f"Prometheus {local.url}: 1 replica(s)"
        finally:
            source.close()
            await local.stop()


async def scraped_pods_are(scraped, expected: set[str]) -> bool:  # type: ignore[no-untyped-def]
    return await scraped() == expected


# ------------------------------------------------------------------ pure parts


def test_queries_are_per_pod_rates_scoped_to_the_fleet() -> None:
    spec = models.PrometheusSpec()
    scope = fleet_scope(spec, "prod", "chat")
    assert engine_queries(scope) == {
        "prompt": 'sum by (pod) (rate(sglang:prompt_tokens_total{fleet="chat",namespace="prod"}[60s]))',
        "cached": 'sum by (pod) (rate(sglang:cached_tokens_total{fleet="chat",namespace="prod"}[60s]))',
        "queue": 'sum by (pod) (sglang:num_queue_reqs{fleet="chat",namespace="prod"})',
    }
    own = models.PrometheusSpec(
        matchLabels={"job": 'odd"name'}, podLabel="kubernetes_pod", rateWindowSeconds=30
    )
    assert engine_queries(fleet_scope(own, "prod", "chat"))["prompt"] == (
        'sum by (kubernetes_pod) (rate(sglang:prompt_tokens_total{job="odd\\"name"}[30s]))'
    )


def test_a_vllm_fleet_reads_vllms_prefix_cache_counters() -> None:
    # vLLM exports no sglang:* series: before, a vLLM fleet's prefill load always read 0
    scope = fleet_scope(models.PrometheusSpec(), "prod", "chat", "vllm")
    sel = '{fleet="chat",namespace="prod"}'
    assert engine_queries(scope) == {
        "prompt": f"sum by (pod) (rate(vllm:prefix_cache_queries_total{sel}[60s]))",
        "cached": f"sum by (pod) (rate(vllm:prefix_cache_hits_total{sel}[60s]))",
        "queue": f"sum by (pod) (vllm:num_requests_waiting{sel})",
    }
    # the emulator exports SGLang's series; every engine kind the spec allows has its names
    assert fleet_scope(models.PrometheusSpec(), "prod", "chat", "emulator").metrics.prompt_tokens == (
        "sglang:prompt_tokens_total"
    )
    any_spec = models.PrometheusSpec()
    queues = {fleet_scope(any_spec, "p", "f", k).metrics.queue_reqs for k in models.ENGINE_KINDS}
    assert queues == {"sglang:num_queue_reqs", "vllm:num_requests_waiting"}


async def test_without_prometheus_a_vllm_fleet_is_read_from_its_sidecars_metrics() -> None:
    served = {"queries": 1000.0, "hits": 250.0}

    async def metrics(_request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:prefix_cache_queries counter\n"
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {served["queries"]}\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {served["hits"]}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="m"} 3.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    scope = fleet_scope(models.PrometheusSpec(), "prod", "chat", "vllm")
    urls = {"chat-0": f"http://127.0.0.1:{port}"}
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            first = await read_engine_metrics(http, urls, {}, None, scope)
            assert first.counters["chat-0"].uncached_tokens == 750.0 and first.rates == {}
            served.update(queries=3000.0, hits=1250.0)  # 2000 more tokens asked for, 1000 of them cached
            await asyncio.sleep(0.05)
            second = await read_engine_metrics(http, urls, first.counters, None, scope)
    finally:
        await runner.cleanup()
    rates = second.rates["chat-0"]
    seconds = second.counters["chat-0"].at_s - first.counters["chat-0"].at_s
    assert rates.uncached_tokens_per_s == pytest.approx(1000.0 / seconds)
    assert rates.queue_reqs == 3.0 and second.source == "scrape"


def test_the_fleet_url_wins_over_the_operator_default() -> None:
    assert prometheus_url(models.PrometheusSpec(url="http://a:9090"), "http://b:9090") == "http://a:9090"
    assert prometheus_url(models.PrometheusSpec(), "http://b:9090") == "http://b:9090"
    assert prometheus_url(models.PrometheusSpec(), "") is None


def test_series_without_a_pod_or_a_number_are_dropped() -> None:
    result = [
        {"metric": {"pod": "a"}, "value": [1.0, "2.5"]},
        {"metric": {"pod": "b"}, "value": [1.0, "NaN"]},
        {"metric": {}, "value": [1.0, "1"]},
        {"metric": {"pod": "c"}, "value": [1.0, "x"]},
    ]
    assert values_by_pod(result, "pod") == {"a": 2.5}


def test_replicas_prometheus_lacks_are_read_from_their_sidecar() -> None:
    from prefixfleet.operator.autoscale_observe import TokenCounters

    before = {"new": TokenCounters(10.0, 100.0, 40.0)}
    now = {"new": TokenCounters(12.0, 300.0, 40.0)}
    reading = engine_reading(
        ["old", "new"],
        before,
        now,
        prometheus_url="http://p:9090",
        prometheus_rates={"old": EngineRates(5.0, 1.0)},
    )
    assert reading.source == "mixed" and not reading.degraded  # a pod not scraped yet is no outage
    assert reading.rates["old"] == EngineRates(5.0, 1.0)
    assert reading.rates["new"].uncached_tokens_per_s == 100.0
    assert "new" in reading.reason and set(reading.counters) == {"new"}
    alone = engine_reading(["a"], {}, {}, prometheus_url=None)
    assert alone.source == "none" and "no Prometheus configured" in alone.reason


def test_a_replica_switched_to_its_sidecar_keeps_its_last_rate_for_one_round() -> None:
    from prefixfleet.operator.autoscale_observe import TokenCounters

    last = {"a": EngineRates(900.0, 300.0)}  # Prometheus' rate before it went down
    first = engine_reading(["a"], {}, {"a": TokenCounters(10.0, 5000.0, 1000.0)}, prometheus_url="http://p:9090",
                           prometheus_problem="cannot connect", last_rates=last)  # fmt: skip
    assert first.rates["a"] == last["a"]  # not idle: the planner keeps seeing the load
    second = engine_reading(["a"], first.counters, {"a": TokenCounters(12.0, 5400.0, 1000.0)},
                            prometheus_url="http://p:9090", prometheus_problem="cannot connect",
                            last_rates=first.rates)  # fmt: skip
    assert second.rates["a"] == EngineRates(200.0, 0.0)  # measured by the scrape from now on
    unanswered = engine_reading(["a"], {}, {}, prometheus_url=None, last_rates=last)
    assert unanswered.rates == {}  # a sidecar that does not answer gets no stale rate


def test_credentials_in_the_url_stay_out_of_logs_and_status() -> None:
    source = PrometheusSource("https://reader:s3cret@prom.example:9443/prometheus")
    try:
        assert source.display_url == "https://prom.example:9443/prometheus"
    finally:
        source.close()


def test_the_chart_checks_its_default_url_like_the_crd() -> None:
    import json

    schema = json.loads(
        (Path(__file__).resolve().parents[1] / "charts/prefixfleet/values.schema.json").read_text()
    )
    default = schema["properties"]["operator"]["properties"]["defaultPrometheusUrl"]
    assert {"pattern": models.PROMETHEUS_URL_PATTERN} in default["anyOf"]


def test_an_outage_is_one_warning_and_its_end_one_notice() -> None:
    down = EngineReading({}, {}, "scrape", "Prometheus x unavailable (cannot connect)", degraded=True)
    up = EngineReading({}, {}, "prometheus", "Prometheus x: 2 replica(s)")
    notices = []
    degraded = False
    for reading in [up, down, down, down, up, up]:
        notices.append(outage_notice(degraded, reading))
        degraded = reading.degraded
    assert [n[0] if n else None for n in notices] == [None, logging.WARNING, None, None, logging.INFO, None]


# ------------------------------------------------------------------ refusing bad input


BAD_URLS = ["localhost:9090", "http://", "ftp://p:9090", "http://p 9090"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_prometheus_url_is_refused_naming_the_field(url: str) -> None:
    spec = {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "prometheus": {"url": url}}
    with pytest.raises(models.InvalidFleetSpec) as err:
        models.validate_spec(spec)
    assert str(err.value).startswith("spec.prometheus.url: ")
    obj = {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": "f"}, "spec": spec}
    problems = admission_errors(build_crd(), obj)
    assert any("spec.prometheus.url" in p for p in problems), problems


def test_label_names_and_window_are_checked() -> None:
    base = {"model": {"name": "m"}, "engine": {"kind": "emulator"}}
    with pytest.raises(models.InvalidFleetSpec, match=r"spec\.prometheus\.matchLabels: 'app-name'"):
        models.validate_spec({**base, "prometheus": {"matchLabels": {"app-name": "x"}}})
    with pytest.raises(models.InvalidFleetSpec, match=r"spec\.prometheus\.rateWindowSeconds"):
        models.validate_spec({**base, "prometheus": {"rateWindowSeconds": 1}})
    obj = {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": "f"},
           "spec": {**base, "prometheus": {"matchLabels": {"app-name": "x"}}}}  # fmt: skip
    assert any("spec.prometheus.matchLabels" in p for p in admission_errors(build_crd(), obj))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["operator", "run", "--prometheus", "localhost:9090"],
            "--prometheus must be an http(s)://HOST[:PORT]",
        ),
        (
            ["up", "--autoscale", "--requests", "0", "--prometheus", "prom:9090"],
            "--prometheus must be an http(s)",
        ),
        (["up", "--requests", "0", "--prometheus", "local"], "--prometheus needs --autoscale"),
    ],
    ids=["operator run", "up", "up without --autoscale"],
)
def test_a_bad_prometheus_flag_is_one_line(argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "prefixfleet.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
