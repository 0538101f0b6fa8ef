"""The dashboard and the alerts against a REAL Prometheus scraping a running local fleet.

One scenario (prefixfleet.observability.scenario): Valkey, 2 emulated replicas with sidecars, 1
gateway, a few hundred tenant requests, a pre-warm, a drain and a scale-down, scraped every second by
Debian's ``prometheus`` (installed by .ci/run) with the shipped alert rules loaded. Then every query
of the dashboard must parse and return data over the run, every alert expression must evaluate, and
``prefixfleet report`` must draw the panels from that Prometheus. A missing ``prometheus`` binary
fails the test: the dashboard would otherwise ship unverified.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet_fixtures import free_port

from prefixfleet.observability import dashboard as dash
from prefixfleet.observability.local_prometheus import LocalPrometheus
from prefixfleet.observability.scenario import ALERTS, ObservedRun, ScenarioSpec, run_scenario

pytestmark = pytest.mark.slow

RATE_WINDOW = "10s"  # >= 4 scrape intervals of the scenario's 1 s
SPEC = ScenarioSpec(fleet="observed", requests=240, rate_rps=40.0, event_hold_s=3.0)


@dataclass(frozen=True)
class Observed:
    prometheus: LocalPrometheus
    run: ObservedRun

    def api(self, path: str, **params: str) -> dict[str, Any]:
        return self.prometheus.api(path, **params)

    def query_range(self, expr: str) -> dict[str, Any]:
        return self.api("query_range", query=expr, start=f"{self.run.start}", end=f"{self.run.end}", step="1")

    @property
    def variables(self) -> dict[str, str]:
        return {"namespace": self.run.namespace, "fleet": self.run.fleet, "__rate_interval": RATE_WINDOW}


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    if not shutil.which("prometheus"):
        pytest.fail(
            "prometheus is not on PATH: install Debian's package "
            "(apt-get update && apt-get install -y prometheus; .ci/run does this)"
        )
    run_dir = tmp_path_factory.mktemp("observed")
    prometheus, run = asyncio.run(run_scenario(SPEC, run_dir, free_port()))
    try:
        assert run.errors == 0 and run.completed == SPEC.requests, run
        yield Observed(prometheus, run)
    finally:
        prometheus.stop()


def has_number(result: dict[str, Any]) -> bool:
    return any(
        math.isfinite(float(v)) for series in result["data"]["result"] for _, v in series.get("values", [])
    )


@pytest.mark.parametrize(("where", "expr"), dash.all_queries(), ids=[w for w, _ in dash.all_queries()])
def test_every_dashboard_query_parses_and_returns_data(observed: Observed, where: str, expr: str) -> None:
    concrete = dash.substitute(expr, observed.variables)
    assert "$" not in concrete, f"{where}: unsubstituted variable in {concrete}"
    answer = observed.query_range(concrete)
    assert answer["status"] == "success", f"{where}: {answer.get('error')}\n{concrete}"
    assert has_number(answer), f"{where} returned no data over the run\n{concrete}"


def test_the_fleet_filter_really_filters(observed: Observed) -> None:
    expr = dash.PANELS[0].queries[0].expr  # TTFT p50
    other = dash.substitute(expr, {**observed.variables, "fleet": "some-other-fleet"})
    answer = observed.query_range(other)
    assert answer["status"] == "success" and not answer["data"]["result"]


@pytest.mark.parametrize("variable", dash.VARIABLES, ids=lambda v: v.name)
def test_variable_queries_offer_this_fleet(observed: Observed, variable: dash.Variable) -> None:
    match, label = dash.parse_label_values(variable.query)
    params: dict[str, Any] = {"start": f"{observed.run.start}", "end": f"{observed.run.end}"}
    if match:
        params["match[]"] = dash.substitute(match, observed.variables)
    answer = observed.api(f"label/{label}/values", **params)
    assert answer["status"] == "success", answer
    assert observed.variables[label] in answer["data"]


ALERT_RULES = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: r.get("alert") or r.get("record"))
def test_every_alert_expression_evaluates(observed: Observed, rule: dict[str, Any]) -> None:
    answer = observed.api("query", query=rule["expr"], time=f"{observed.run.end}")
    assert answer["status"] == "success", f"{rule['alert']}: {answer.get('error')}"
    assert isinstance(answer["data"]["result"], list)


def test_prometheus_loaded_and_evaluated_every_rule_without_error(observed: Observed) -> None:
    groups = observed.api("rules")["data"]["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in ALERT_RULES}
    for name, rule in loaded.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"


def test_report_renders_the_main_panels_from_that_prometheus(observed: Observed, tmp_path: Path) -> None:
    run = observed.run
    out = tmp_path / "report"
    argv = [
        sys.executable, "-m", "prefixfleet.cli", "report",
        "--prometheus", observed.prometheus.url,
        "--fleet", run.fleet, "--namespace", run.namespace,
        "--since", f"{math.ceil(run.end - run.start)}s", "--until", f"{run.end}",
        "--rate-window", RATE_WINDOW,
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    reported = [p for p in dash.PANELS if p.in_report]
    for panel in reported:
        png = out / f"{panel.slug}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", panel.slug
        assert str(png) in result.stdout
    assert (out / "overview.png").stat().st_size > 20_000
    summary = json.loads((out / "report.json").read_text())
    for panel in reported:
        got = summary["panels"][panel.slug]
        values = (
            [v for per in got["at_end"].values() for v in per.values()]
            if "at_end" in got
            else got["last"].values()
        )
        assert any(v is not None for v in values), f"{panel.slug}: no data in the report"
    hit_rate = summary["panels"]["hit-rate-fleet"]["last"]["engines (measured)"]
    assert 0.0 < hit_rate <= 1.0  # tenants share prefixes: the fleet must report some hits


def test_report_says_clearly_when_prometheus_is_unreachable(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "prefixfleet.cli", "report", "--prometheus", url, "--out", str(tmp_path)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"prefixfleet report: error: cannot reach Prometheus at {url}: connection refused"
    ]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--since", "yesterday"], "--since"),
        (["--fleet", "bad fleet!"], "--fleet"),
        (["--prometheus", "localhost:9090"], "--prometheus"),
    ],
)
def test_report_refuses_bad_flags_by_name(tmp_path: Path, flags: list[str], message: str) -> None:
    argv = [sys.executable, "-m", "prefixfleet.cli", "report", "--prometheus", "http://127.0.0.1:1"]
    argv += ["--out", str(tmp_path), *flags]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_sidecars_expose_their_own_metrics_next_to_the_engines(observed: Observed) -> None:
    sel = f'fleet="{observed.run.fleet}", pod="replica-1"'
    drained = observed.query_range(f'max_over_time(prefixfleet_sidecar_state{{{sel}, state="draining"}}[1h])')
    assert drained["status"] == "success" and has_number(drained)
    assert max(float(v) for _, v in drained["data"]["result"][0]["values"]) == 1.0
    engine = observed.query_range(f"sglang:num_requests_total{{{sel}}}")  # same scrape, same target
    assert has_number(engine)
