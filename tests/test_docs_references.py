"""Every repository path, test id and Python name the README and docs/*.md quote in code exists.

tests/test_docs_links.py follows Markdown links; these are the references written as code
(`router/view.py`, `tests/test_crd.py::test_...`, `prefixfleet.router.policies.DEFAULT_POLICY`),
which a newcomer opens or runs as they are. A renamed file, test or constant must fail here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = "router|operator|sim|emulator|prefixfleet|charts|crds|examples|traces|docs|tests"
PATH = re.compile(rf"`((?:{TOP})/[A-Za-z0-9_./*-]*)(?:::([A-Za-z0-9_]+))?")
NAME = re.compile(r"`(prefixfleet\.[A-Za-z0-9_.]+)")
NOT_PYTHON = {"prefixfleet.io"}  # the API group


def path_problems(text: str, root: Path = ROOT) -> list[str]:
    problems = []
    for ref, test in PATH.findall(text):
        path = root / ref.rstrip("./")
        if "*" in ref:  # `tests/test_addresses*.py`: a glob must match something
            if not list(root.glob(ref)):
                problems.append(f"{ref}: matches nothing")
        elif not path.exists():
            problems.append(f"{ref}: no such path")
        elif test and not re.search(rf"^(?:async )?def {test}\b", path.read_text(), re.M):
            problems.append(f"{ref}::{test}: no such test")
    return problems


def name_problems(text: str) -> list[str]:
    problems = []
    for ref in sorted(set(NAME.findall(text)) - NOT_PYTHON):
        parts = ref.rstrip(".").split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                problems.append(f"{ref}: no {'.'.join(parts[i:])} in {'.'.join(parts[:i])}")
            break
        else:
            problems.append(f"{ref}: nothing to import")
    return problems


def test_the_checkers_find_a_missing_path_test_and_name(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_here():\n    pass\n")
    text = "`tests/test_a.py::test_here` `tests/test_a.py::test_gone` `tests/test_b.py` `tests/test_a*.py`"
    assert path_problems(text, tmp_path) == [
        "tests/test_a.py::test_gone: no such test",
        "tests/test_b.py: no such path",
    ]
    assert name_problems(
        "`prefixfleet.router.policies.DEFAULT_POLICY` `prefixfleet.router.policies.NOPE`"
    ) == ["prefixfleet.router.policies.NOPE: no NOPE in prefixfleet.router.policies"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_path_test_and_name_exists(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    assert path_problems(text) + name_problems(text) == []
