"""docs/operator.md's chart table gives the ServiceAccount name the chart creates by default.

The row said the default was the release name; the chart names it by its full name
(``prefixfleet.fullname``): release ``team`` gets ``team-prefixfleet``. A user granting the operator's
ServiceAccount something by hand (a cloud IAM role's trust, an image pull secret) or writing an
audit rule for release ``team`` named an account that does not exist.
"""

from __future__ import annotations

from pathlib import Path

import helm_python
import yaml

from tests.test_chart import by_kind

DOC = Path(__file__).resolve().parents[1] / "docs" / "operator.md"


def created_account(chart: helm_python.Chart, release: str) -> str:
    manifests = chart.render({}, name=release, namespace="ops")
    texts = [text for path, text in manifests.items() if path.endswith(".yaml")]
    objects = [d for text in texts for d in yaml.safe_load_all(text) if d]
    (account,) = by_kind(objects, "ServiceAccount")
    return account["metadata"]["name"]


def test_the_default_account_is_the_full_name_as_the_table_says(chart: helm_python.Chart) -> None:
    assert created_account(chart, "team") == "team-prefixfleet"  # not the release name
    assert created_account(chart, "prefixfleet-prod") == "prefixfleet-prod"  # it contains the chart's
    (row,) = [line for line in DOC.read_text().splitlines() if line.startswith("| `serviceAccount.create`")]
    default = row.split(" | ")[1]
    assert "`<release>-prefixfleet`" in default and "fullnameOverride" in default
    assert not default.split(" / ")[1].startswith("release name")
