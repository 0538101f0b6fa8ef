"""The shipped alert rules: valid for Prometheus, and each fires on its problem and stays quiet otherwise.

Uses Debian's ``promtool`` (package ``prometheus``; .ci/run installs it). Missing promtool is a
failure, not a skip: the alerts would otherwise ship untested.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "charts" / "prefixfleet" / "files" / "alerts.yaml"
UNIT_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts_test.yaml"


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail(
            "promtool is not on PATH: install Debian's prometheus package "
            "(apt-get update && apt-get install -y prometheus; .ci/run does this)"
        )
    return found


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_rules_file_is_valid_for_prometheus() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_every_alert_fires_on_its_problem_and_stays_quiet_otherwise(tmp_path: Path) -> None:
    # promtool compares annotations verbatim; the unit tests check when alerts fire (labels), so
    # they run against a copy without annotations (whose templates `promtool check rules` checks).
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = subprocess.run(
        [promtool(), "test", "rules", UNIT_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_has_a_firing_and_a_quiet_case() -> None:
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for rule in alert_rules():
        assert cases.get(rule["alert"]) == {True, False}, f"{rule['alert']} needs a firing and a quiet case"


def test_every_alert_has_a_severity_and_says_what_to_do() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert rule.get("for"), f"{rule['alert']} would fire on a single bad scrape"
