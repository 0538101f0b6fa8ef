"""The Makefile's `## ...` target comments say what the recipe runs: `sim` said "every workload"
while its recipe runs only --workload prefixroute."""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def targets() -> dict[str, tuple[str, str]]:
    """Each target with a `## comment`: (comment, its recipe's text)."""
    found: dict[str, tuple[str, str]] = {}
    name = None
    for line in MAKEFILE.read_text().splitlines():
        head = re.match(r"^([\w.-]+):[^#]*##\s*(.*)$", line)
        if head:
            name = head.group(1)
            found[name] = (head.group(2), "")
        elif line.startswith("\t") and name:
            comment, recipe = found[name]
            found[name] = (comment, recipe + line + "\n")
        else:
            name = None
    return found


def test_a_target_comment_names_each_workload_its_recipe_runs() -> None:
    found = targets()
    assert "sim" in found
    for name, (comment, recipe) in found.items():
        workloads = re.findall(r"--workload[ =](\S+)", recipe)
        for workload in workloads:
            assert workload in comment, f"make {name}: '## {comment}' does not say it runs {workload}"
        if len(set(workloads)) <= 1:
            assert "every workload" not in comment, f"make {name} runs {workloads or 'no workload'}"
