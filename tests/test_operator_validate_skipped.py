"""`prefixfleet operator validate` says in words which document it skipped and what it is.

A YAML document that is a bare number read "skipped a int (not a PrefixCacheFleet)": Python's type
name, a wrong article, and no hint which document. A document that is no Kubernetes object at all
(a number, a string, a list, true, an object without a kind, a null list item) is now named by its
place and said to be no Kubernetes object; objects of another kind keep "skipped a ConfigMap",
with "an" before a vowel. Skipping stays what it was: the fleet beside them is still checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prefixfleet.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "emulator-fleet.yaml"


def _validate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """validate's output lines for ``text`` followed by the example fleet (so it exits 0)."""
    path = tmp_path / "in.yaml"
    path.write_text(text + "\n---\n" + EXAMPLE.read_text())
    assert main(["operator", "validate", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"{path}: emulator-fleet: ok"
    prefix = f"{path}: "
    assert all(line.startswith(prefix) for line in lines)
    return [line[len(prefix) :] for line in lines[:-1]]


@pytest.mark.parametrize(
    ("document", "what"),
    [
        ("5", "a number"),
        ("2.5", "a number"),
        ("hello", "a string"),
        ("[a, b]", "a list"),
        ("true", "true or false"),
        ("{metadata: {name: x}}", "an object with no kind"),
        ("{kind: 5}", "an object whose kind is 5"),
    ],
)
def test_a_document_that_is_no_kubernetes_object_is_named_by_its_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str, what: str
) -> None:
    text = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n{document}"
    assert _validate(tmp_path, text, capsys) == [
        "skipped a ConfigMap (not a PrefixCacheFleet)",
        f"skipped document 2: {what}, not a Kubernetes object",
    ]


def test_empty_documents_count_as_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `---` twice makes an empty document 1 (nothing to say) before document 2, the way an editor counts
    lines = _validate(tmp_path, "---\n---\n7", capsys)
    assert lines == ["skipped document 2: a number, not a Kubernetes object"]


def test_a_list_item_is_named_by_its_document_and_item(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [None, 3, {"kind": "Secret"}]})
    assert _validate(tmp_path, text, capsys) == [
        "skipped document 1, item 1: null, not a Kubernetes object",
        "skipped document 1, item 2: a number, not a Kubernetes object",
        "skipped a Secret (not a PrefixCacheFleet)",
    ]


def test_a_kind_starting_with_a_vowel_reads_an(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: i}"
    assert _validate(tmp_path, text, capsys) == ["skipped an Ingress (not a PrefixCacheFleet)"]
