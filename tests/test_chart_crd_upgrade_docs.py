"""The CRD upgrade the docs prescribe (Helm never upgrades a chart's crds/) works as written.

Helm creates the CRD from crds/ and so becomes the field manager of its spec. A later
``kubectl apply --server-side`` of a changed CRD is then refused for every changed field ("Apply
failed with 1 conflict: conflict with "helm" using apiextensions.k8s.io/v1: .spec.versions",
prometheus-community/helm-charts#2489, ansible/awx-operator#1716) unless it takes them over with
``--force-conflicts``. Specification: every command in README.md and docs/ that server-side applies
the CRD forces the conflicts, is run before ``helm upgrade``, and applies a file that is the chart's CRD.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART_CRD = ROOT / "charts" / "prefixfleet" / "crds" / "prefixcachefleets.prefixfleet.io.yaml"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"kubectl apply --server-side[^\n`]*")


def crd_applies() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for command in COMMAND.findall(doc.read_text()):
            argv = shlex.split(command.split("#")[0])
            if any(a.endswith("prefixcachefleets.prefixfleet.io.yaml") for a in argv):
                found.append((doc.name, argv))
    return found


def test_the_operator_docs_say_how_to_upgrade_the_crd() -> None:
    assert "operator.md" in {doc for doc, _ in crd_applies()}


def test_every_server_side_apply_of_the_crd_takes_over_helms_fields() -> None:
    for doc, argv in crd_applies():
        assert "--force-conflicts" in argv, f"{doc}: {shlex.join(argv)} conflicts with Helm's fields"
        (path,) = [a for a in argv if a.endswith(".yaml")]
        assert (ROOT / path).read_text() == CHART_CRD.read_text(), f"{doc}: {path} is not the chart's CRD"
        text = (ROOT / "docs" / doc if doc != "README.md" else ROOT / doc).read_text()
        upgrade = re.search(r"^helm upgrade ", text, re.MULTILINE)
        assert upgrade and text.index(shlex.join(argv)) < upgrade.start(), f"{doc}: apply the CRD first"
