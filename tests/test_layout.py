"""The repository layout never shadows the standard library's ``operator`` module."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_python_run_from_the_repository_root_imports_the_standard_operator_module():
    # `python -m ...` puts the working directory first on sys.path before the standard library loads
    # collections -> operator; a top-level operator/__init__.py would break every such command.
    probe = "import operator, collections; print(operator.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out).parent == Path(sysconfig.get_paths()["stdlib"])
    ran = subprocess.run(
        [sys.executable, "-m", "json.tool", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_the_operator_package_still_imports_as_prefixfleet_operator():
    out = subprocess.run(
        [sys.executable, "-c", "import prefixfleet.operator.models as m; print(m.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out) == ROOT / "operator" / "models.py"
