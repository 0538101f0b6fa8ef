"""The observability files live in the package; the chart carries copies written from it.

``prefixfleet/observability/alerts.yaml`` is the alert rules' source (the scenario's Prometheus loads
it, installed or not) and the dashboard JSON is rendered from ``dashboard.PANELS``. Helm reads only
files inside the chart directory, so ``charts/prefixfleet`` holds copies, written and checked by
``python -m prefixfleet.observability.dashboard``. The same commands from an installed wheel, outside
the source tree: tests/test_image_runtime_closure.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prefixfleet.observability import dashboard, scenario

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "prefixfleet"


def test_the_alert_rules_are_package_data_and_the_chart_carries_them_verbatim() -> None:
    package_copy = ROOT / "prefixfleet" / "observability" / "alerts.yaml"
    assert dashboard.ALERTS == scenario.ALERTS == package_copy
    assert (CHART / "files" / "alerts.yaml").read_bytes() == package_copy.read_bytes(), (
        "charts/prefixfleet/files/alerts.yaml differs from the package's: edit"
        f" {package_copy.relative_to(ROOT)} and run `{dashboard.REGENERATE}`"
    )


def test_the_chart_files_are_exactly_what_the_package_gives() -> None:
    files = dashboard.chart_files()
    assert sorted(files) == ["dashboards/prefixfleet.json", "files/alerts.yaml"]
    assert dashboard.main(["--check"]) == 0  # the checkout's chart, by default


def copy_chart(tmp_path: Path) -> Path:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    return chart


def test_check_names_each_stale_file_and_writing_fixes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = copy_chart(tmp_path)
    (chart / "files" / "alerts.yaml").write_text("groups: []\n")
    (chart / "dashboards" / "prefixfleet.json").unlink()
    assert dashboard.main(["--check", "--chart", str(chart)]) == 1
    err = capsys.readouterr().err
    assert f"{chart / 'files' / 'alerts.yaml'} is out of date" in err
    assert f"{chart / 'dashboards' / 'prefixfleet.json'} is out of date" in err
    assert dashboard.main(["--chart", str(chart)]) == 0
    for relative in dashboard.chart_files():
        assert (chart / relative).read_bytes() == (CHART / relative).read_bytes(), relative
    assert dashboard.main(["--check", "--chart", str(chart)]) == 0


def test_without_a_chart_it_says_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As from an installed wheel: no charts/ next to the package."""
    monkeypatch.setattr(dashboard, "CHART", tmp_path / "absent" / "charts" / "prefixfleet")
    with pytest.raises(SystemExit) as exc:
        dashboard.main([])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no chart" in err and "--chart DIR" in err and "--out" in err, err


def test_a_directory_that_is_no_chart_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        dashboard.main(["--chart", str(tmp_path)])
    assert exc.value.code == 2
    assert f"--chart {tmp_path}: no Chart.yaml there" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_out_dash_prints_the_dashboard_and_out_file_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dashboard.main(["--out", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (CHART / "dashboards" / "prefixfleet.json").read_text()
    )
    target = tmp_path / "dash.json"
    assert dashboard.main(["--out", str(target)]) == 0
    assert target.read_text() == dashboard.render_json()
    assert dashboard.main(["--check", "--out", str(target)]) == 0
    with pytest.raises(SystemExit) as exc:
        dashboard.main(["--check", "--out", "-"])
    assert exc.value.code == 2
