"""The Grafana dashboard: generated from prefixfleet.observability.dashboard, structurally sound, and
parsed by Grafana's own foundation SDK."""

from __future__ import annotations

import json
import re

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard
from grafana_foundation_sdk.models.prometheus import Dataquery

from prefixfleet.observability import dashboard as dash

VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def committed() -> dict:
    return json.loads(dash.DASHBOARD_PATH.read_text())


def test_committed_json_is_the_generated_one() -> None:
    assert dash.DASHBOARD_PATH.read_text() == dash.render_json(), f"stale: run {dash.REGENERATE}"


def test_panel_ids_are_unique_and_every_panel_queries_the_datasource_variable() -> None:
    d = committed()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    for annotation in d["annotations"]["list"]:
        assert annotation["datasource"]["uid"] == "${datasource}" and annotation["expr"].strip()


def test_variables_are_datasource_namespace_and_fleet_and_every_query_uses_only_those() -> None:
    d = committed()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "fleet"} <= variables.keys()
    known = set(variables) | {"__rate_interval"}
    for where, expr in dash.all_queries():
        assert set(VARIABLE.findall(expr)) <= known, where
        assert 'namespace=~"$namespace"' in expr and 'fleet=~"$fleet"' in expr, where


def test_panels_do_not_overlap() -> None:
    cells = set()
    for panel in committed()["panels"]:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, panel["title"]
        assert g["x"] + g["w"] <= 24
        cells |= mine


def test_grafana_foundation_sdk_parses_it_into_prometheus_queries() -> None:
    register_default_plugins()
    raw = committed()
    model = Dashboard.from_json(raw)
    assert model.uid == raw["uid"] and model.title == raw["title"]
    assert [v.name for v in model.templating.list_val] == [v["name"] for v in raw["templating"]["list"]]
    assert len(model.panels) == len(raw["panels"])
    for parsed, original in zip(model.panels, raw["panels"], strict=True):
        assert parsed.id_val == original["id"] and parsed.type_val == original["type"]
        assert all(isinstance(t, Dataquery) for t in parsed.targets), original["title"]
        assert [t.expr for t in parsed.targets] == [t["expr"] for t in original["targets"]]
    again = json.loads(json.dumps(model, cls=JSONEncoder))  # a round trip through the SDK's model
    assert [p["title"] for p in again["panels"]] == [p["title"] for p in raw["panels"]]
    assert [t["expr"] for p in again["panels"] for t in p["targets"]] == [
        t["expr"] for p in raw["panels"] for t in p["targets"]
    ]


def test_the_panels_the_issue_asks_for_are_there() -> None:
    titles = " | ".join(p.title.lower() for p in dash.PANELS)
    for needed in (
        "time to first token",
        "requests and errors",
        "hit rate, fleet",
        "hit rate per replica",
        "matched-token ratio by routing reason",
        "queue depth per replica",
        "load share per replica",
        "hot subtrees",
        "where hot subtrees live",
        "replicas",
        "summary staleness",
        "decision latency",
    ):
        assert needed in titles, needed
    assert {a.name for a in dash.ANNOTATIONS} == {"Scale events", "Pre-warm", "Drain"}


def test_label_values_queries_parse() -> None:
    assert dash.parse_label_values("label_values(up, job)") == ("up", "job")
    assert dash.parse_label_values('label_values(m{a=~"$a"}, fleet)') == ('m{a=~"$a"}', "fleet")
