"""``prefixfleet report --fleet NAME`` for the names fleets have: with dashes and dots.

The report fills the dashboard's ``fleet=~"$fleet"`` matchers with the name regex-escaped. Python's
``re.escape`` writes ``emulator\\-fleet``; in a PromQL string ``\\-`` is an unknown escape sequence, so
every query of ``--fleet emulator-fleet`` (the example fleet's name) was refused with a parse error
and the report failed. Checked with ``promtool``: every report query parses, and the matcher selects
the named fleet and nothing else (``a.b`` must not select ``axb``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from prefixfleet.observability.dashboard import PANELS, substitute
from prefixfleet.observability.report import Window, panel_variables

NAMES = ["emulator-fleet", "a.b", "chat"]


def _promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool is not on PATH: install Debian's prometheus package (.ci/run does this)")
    return found


def _run(args: list[str], cwd: Path) -> None:
    result = subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", NAMES)
def test_every_report_query_parses_for_a_fleet_and_namespace_name(name: str, tmp_path: Path) -> None:
    variables = panel_variables(name, name, Window.last(900.0, end=1_000_000.0))
    queries = [substitute(q.expr, variables) for p in PANELS if p.in_report for q in p.queries]
    assert queries and all(f'fleet=~"{variables["fleet"]}"' in q for q in queries)
    rules = [{"record": f"report:query_{i}", "expr": q} for i, q in enumerate(queries)]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "report", "rules": rules}]}))
    _run(["check", "rules", "queries.yaml"], tmp_path)


def test_the_fleet_matcher_selects_exactly_the_named_fleet(tmp_path: Path) -> None:
    fleets = ["emulator-fleet", "emulatorXfleet", "a.b", "axb", "chat"]
    series = [
        {"series": f'prefixfleet_gateway_redis_up{{namespace="ns",fleet="{f}",pod="g0"}}', "values": "1x5"}
        for f in fleets
    ]
    window = Window.last(900.0, end=1_000_000.0)
    checks = []
    for name in ("emulator-fleet", "a.b"):
        variables = panel_variables(name, "ns", window)
        expr = substitute(
            'sum by (fleet) (prefixfleet_gateway_redis_up{namespace=~"$namespace", fleet=~"$fleet"})',
            variables,
        )
        checks.append(
            {"expr": expr, "eval_time": "2m", "exp_samples": [{"labels": f'{{fleet="{name}"}}', "value": 1}]}
        )
    (tmp_path / "empty.yaml").write_text(yaml.safe_dump({"groups": []}))
    test = {
        "rule_files": ["empty.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    _run(["test", "rules", "test.yaml"], tmp_path)
