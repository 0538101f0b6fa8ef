"""The columns `helm install`'s notes say `kubectl get pcf` prints are the CRD's printer columns.

NOTES.txt listed "Desired, Ready, Hit rate, Policy, Age" after the CRD gained the autoscaler's
Scaling and Limited by columns (status.autoscaler.decision): a user looking for why a fleet does not
scale was not told the answer is in the default output.
"""

from __future__ import annotations

import re

import yaml

from tests.chart_fixtures import CHART
from tests.test_chart_notes import notes


def test_the_notes_list_the_crds_default_printer_columns_in_order() -> None:
    crd = yaml.safe_load((CHART / "crds" / "prefixcachefleets.prefixfleet.io.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    match = re.search(r"^\s*kubectl get pcf\s+#\s*(.+)$", notes({}), re.MULTILINE)
    assert match is not None
    assert [c.strip() for c in match.group(1).split(",")] == columns
