"""Every third-party module the product imports at load time is a declared runtime dependency.

A wheel installed without the test extra (the Docker image, ``pip install prefixfleet``) must import:
the tests' own venv has every extra installed, so a module-level import of a test-only package
(jsonschema was one: ``prefixfleet --help`` died with ModuleNotFoundError) passes every other test.
Imports inside functions are left out on purpose: those are optional features that check for
their package (cel-python for ``operator validate``'s CEL rules, uvloop).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_DIRS = ("prefixfleet", "router", "operator", "sim", "emulator")


def module_level_imports(tree: ast.Module) -> set[str]:
    """Top-level package names imported outside any function (including under if/try at module
    or class level), absolute imports only."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.ClassDef):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(tree.body)
    return found


def declared_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = (re.match(r"[A-Za-z0-9_.\-]+", spec).group(0) for spec in project["dependencies"])
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names}


def test_module_level_imports_are_runtime_dependencies() -> None:
    owners = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    undeclared: dict[str, set[str]] = {}
    for directory in PRODUCT_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            for name in module_level_imports(ast.parse(path.read_text(), str(path))):
                if name in sys.stdlib_module_names or name == "prefixfleet" or name == "__future__":
                    continue
                dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(name, [name])}
                if not dists & declared:
                    undeclared.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported at load time but not in [project].dependencies: {undeclared}"


def test_the_check_sees_a_test_only_import() -> None:
    """The scanner itself: a module-level import of a test extra is caught, a lazy one is not."""
    source = "import yaml\ntry:\n    import pytest\nexcept ImportError:\n    pass\n"
    source += "def f():\n    import hypothesis\n"
    tree = ast.parse(source)
    assert module_level_imports(tree) == {"yaml", "pytest"}
    assert "pytest" not in declared_distributions()
