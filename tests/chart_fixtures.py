"""The Helm chart as the chart tests load and render it.

``tests/conftest.py`` registers the ``chart`` fixture (as it does ``fleet_fixtures``'), so a test module
requests ``chart`` and can ``from chart_fixtures import CHART, render``.

* ``CHART`` — the chart's directory (``charts/prefixfleet``).
* ``chart`` — the chart loaded once per test module, released after it.
* ``render(chart, values)`` — the objects the chart renders with ``values`` (release and namespace
  ``prefixfleet``), NOTES.txt left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "prefixfleet"
RELEASE, NAMESPACE = "prefixfleet", "prefixfleet"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm_python.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
