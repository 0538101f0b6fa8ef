"""The image's Python environment, replayed: the wheel with only its runtime dependency closure.

The Docker image installs the prefixfleet wheel and what its ``[project].dependencies`` pull in,
nothing from the test extra. tests/test_dockerfile.py runs the wheel from a fresh venv, but with the
test venv's whole site-packages behind it, so a module only a test extra brings (jsonschema, until
7f0e7e4) is still found there; tests/test_runtime_dependencies.py reads module-level imports only.
Here the fresh venv sees exactly the distributions the image would have: prefixfleet's runtime
requirements, followed through each distribution's own requirements (markers evaluated, no extras),
linked into one directory. In it every module of the product must import (lazy imports inside
functions included: the Prometheus client, matplotlib with a headless backend), and
`prefixfleet operator run` must start kopf and reconcile a fleet against the emulated API server.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fleet_fixtures import free_port
from packaging.requirements import Requirement

from tests.k8s.cluster import EmulatedCluster, wait_for
from tests.test_dockerfile import DOCKERFILE, build_wheel, stages

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> set[str]:
    """Canonical names of every distribution a `pip install prefixfleet` (no extras) brings in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pending = [Requirement(spec) for spec in project["dependencies"]]
    seen: set[str] = set()
    while pending:
        req = pending.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonical(req.name)
        if name in seen:
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(req.name)  # installed in the test venv, or a KeyError
        pending += [Requirement(spec) for spec in dist.requires or []]
    return seen


def link_distributions(names: set[str], into: Path) -> None:
    """Link each distribution's top-level entries (packages, modules, .dist-info) into ``into``."""
    into.mkdir()
    for dist in importlib.metadata.distributions():
        if canonical(dist.metadata["Name"]) not in names or not dist.files:
            continue
        base = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}:
            target = into / top
            if (base / top).exists() and not target.exists() and not top.endswith(".pth"):
                target.symlink_to(base / top)


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv with the wheel (built from what the Dockerfile copies) and only the runtime closure."""
    tmp = tmp_path_factory.mktemp("image")
    wheel = build_wheel(stages(DOCKERFILE.read_text())["builder"], tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    subprocess.run([*pip, "install", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    deps = tmp / "deps"
    link_distributions(runtime_closure(), deps)
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "deps.pth").write_text(f"{deps}\n")
    yield venv / "bin" / "python"


def run_in_image(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPLBACKEND", "DISPLAY")}
    return subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_closure_leaves_the_test_extra_out() -> None:
    closure = runtime_closure()
    assert {"kopf", "kubernetes", "jsonschema", "prometheus-api-client", "xxhash"} <= closure
    assert not {"pytest", "kmock", "helm-python-sdk", "cel-python", "kubernetes-validate"} & closure


def test_a_test_only_module_is_not_importable_there(image_python: Path, tmp_path: Path) -> None:
    """The environment is really the image's: what only the test extra brings is missing."""
    for module in ("kmock", "pytest", "celpy"):
        result = run_in_image(image_python, f"import {module}", tmp_path)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, module


# Every lazy import the product makes (inside functions), run as the code runs it.
LAZY_PATHS = """
import importlib, pathlib, prefixfleet
# every file, not pkgutil.walk_packages: prefixfleet.operator has no __init__.py in the wheel (a
# namespace portion), and walk_packages does not descend into those
root = pathlib.Path(prefixfleet.__file__).parent
parts = [p.relative_to(root).with_suffix("").parts for p in root.rglob("*.py")]
names = sorted(".".join(("prefixfleet", *part)) for part in parts)
for name in names:
    importlib.import_module(name.removesuffix(".__init__"))
assert "prefixfleet.operator.handlers" in names and "prefixfleet.router.cli" in names, names
from prefixfleet.observability import report
import prometheus_api_client, prometheus_api_client.exceptions, requests, urllib3.util.retry
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.figure(); plt.plot([0, 1]); plt.savefig("plot.png")
import redis.asyncio, tqdm, xxhash, httptools, uvloop
from prefixfleet.fleet.processes import redis_server_binary
print(redis_server_binary())
print("ok")
"""


def test_every_module_and_every_lazy_import_loads_with_runtime_dependencies_only(
    image_python: Path, tmp_path: Path
) -> None:
    result = run_in_image(image_python, LAZY_PATHS, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_operator_validate_runs_without_cel_python(image_python: Path, tmp_path: Path) -> None:
    """cel-python is a test extra: `operator validate` says its CEL rules are checked by the models."""
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "examples" / "emulator-fleet.yaml", fleet)
    cli = image_python.parent / "prefixfleet"
    result = subprocess.run([str(cli), "operator", "validate", str(fleet)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "cel-python is not installed" in result.stderr
    assert result.stdout.strip().endswith(": ok")


def test_the_operator_reconciles_a_fleet_with_runtime_dependencies_only(
    image_python: Path, tmp_path: Path
) -> None:
    """`operator run` as the chart runs it (liveness and metrics ports) from the image's environment."""
    cluster = EmulatedCluster(tmp_path / "cluster")
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "KUBECONFIG": str(cluster.kubeconfig),
        "PREFIXFLEET_WATCH_SERVER_TIMEOUT": "20",
        "PREFIXFLEET_METRICS_ADDR": "127.0.0.1",
    }
    argv = [str(image_python.parent / "prefixfleet"), "operator", "run", f"--liveness={liveness}",
            f"--metrics-port={free_port()}", "--redis", "redis://127.0.0.1:1/0"]  # fmt: skip
    log = tmp_path / "operator.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        cluster.install_crd()
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        cluster.apply(ROOT / "examples" / "emulator-fleet.yaml")

        def reconciled() -> bool:
            fleets = cluster.api.objects("prefixcachefleets", "prefixfleet.io", "v1alpha1")
            return bool(fleets) and "observedGeneration" in (fleets[0].get("status") or {})

        wait_for(reconciled, 60, what="the operator (runtime dependencies only) to reconcile the fleet")
        assert len(cluster.api.objects("pods")) == 4
        assert process.poll() is None
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(15)
        cluster.close()
        print(log.read_text(errors="replace")[-4000:] if log.exists() else "")
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "ModuleNotFoundError" not in text, text[-4000:]


# The observed-fleet scenario's Prometheus, started as the scenario starts it, with no targets: the
# alert rules it loads come from the installed package (no charts/ next to a wheel).
SCENARIO_PROMETHEUS = """
import json, pathlib, sys
from prefixfleet.fleet.processes import free_port
from prefixfleet.observability import scenario
assert pathlib.Path(sys.prefix) in scenario.ALERTS.parents, scenario.ALERTS
spec = scenario.ScenarioSpec()
with scenario.observed_prometheus(pathlib.Path("prometheus"), free_port(), [], spec) as prometheus:
    groups = prometheus.api("rules")["data"]["groups"]
print(json.dumps(sorted(g["name"] for g in groups)))
"""


def test_the_observability_commands_run_from_the_installed_wheel(image_python: Path, tmp_path: Path) -> None:
    """The dashboard command and the scenario's Prometheus, outside the source tree: what they read
    from charts/ before (the alert rules, the chart to write) comes with the package or is asked for."""
    chart_source = ROOT / "charts" / "prefixfleet"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def dashboard(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(image_python), "-m", "prefixfleet.observability.dashboard", *args]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)

    printed = dashboard("--out", "-")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == (chart_source / "dashboards" / "prefixfleet.json").read_text()
    bare = dashboard()  # no checkout around the installed package: it says what to pass, no traceback
    assert bare.returncode == 2 and "--chart DIR" in bare.stderr and "Traceback" not in bare.stderr, (
        bare.stderr
    )

    chart = tmp_path / "chart"
    shutil.copytree(chart_source, chart)
    (chart / "files" / "alerts.yaml").unlink()
    stale = dashboard("--check", "--chart", str(chart))
    assert stale.returncode == 1 and "alerts.yaml is out of date" in stale.stderr, stale.stderr
    written = dashboard("--chart", str(chart))
    assert written.returncode == 0, written.stderr
    for relative in ("files/alerts.yaml", "dashboards/prefixfleet.json"):
        assert (chart / relative).read_bytes() == (chart_source / relative).read_bytes(), relative

    result = run_in_image(image_python, SCENARIO_PROMETHEUS, tmp_path)
    assert result.returncode == 0, result.stderr
    shipped = yaml.safe_load((chart_source / "files" / "alerts.yaml").read_text())["groups"]
    assert json.loads(result.stdout.splitlines()[-1]) == sorted(g["name"] for g in shipped)
