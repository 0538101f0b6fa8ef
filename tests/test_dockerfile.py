"""The Dockerfile, checked without a Docker engine: its structure is parsed, its install steps are
replayed in a temporary build context and a fresh venv, and every command the image, the chart and
the operator's roles run must exist in the `prefixfleet` CLI."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import helm_python
import pytest
import yaml

from prefixfleet.cli import build_parser
from prefixfleet.operator.crd import render_crd_yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Instructions per build stage, keyed by the stage name (``AS name``)."""
    args: dict[str, str] = {}
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in instructions(text):
        if keyword == "ARG" and current is None:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            image, _, name = re.sub(r"\s+AS\s+", " AS ", rest, flags=re.I).partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
            current = result.setdefault(name.strip() or str(len(result)), [])
            current.append(("FROM", image))
        else:
            assert current is not None, f"{keyword} before FROM"
            current.append((keyword, rest))
    return result


@pytest.fixture(scope="module")
def dockerfile() -> dict[str, list[tuple[str, str]]]:
    return stages(DOCKERFILE.read_text())


def final_value(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for kw, rest in stage if kw == keyword]
    assert values, f"no {keyword} in the final stage"
    return values[-1]


def package_dirs() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["tool"]["setuptools"]["package-dir"].values())


def copied_paths(stage: list[tuple[str, str]]) -> list[str]:
    paths: list[str] = []
    for keyword, rest in stage:
        if keyword == "COPY" and "--from" not in rest:
            *sources, _dest = rest.split()
            paths += sources
    return paths


# ------------------------------------------------------------------ structure


def test_two_stages_builder_then_slim_python_runtime(dockerfile: dict[str, list[tuple[str, str]]]) -> None:
    assert list(dockerfile) == ["builder", "runtime"]
    assert dockerfile["runtime"][0] == ("FROM", "python:3.11-slim")
    assert dockerfile["builder"][0][1].startswith("python:3.11")


def test_builder_copies_every_package_folder_and_nothing_else(
    dockerfile: dict[str, list[tuple[str, str]]],
) -> None:
    copied = copied_paths(dockerfile["builder"])
    assert "." not in copied, "copy named folders, not the whole context"
    assert {"pyproject.toml", "README.md"} <= set(copied)
    top_level = {d.split("/")[0] for d in package_dirs()}
    assert top_level <= set(copied), f"missing package folders: {top_level - set(copied)}"
    assert any("pip wheel" in rest for kw, rest in dockerfile["builder"] if kw == "RUN")


def test_runtime_installs_the_wheels_offline_and_runs_as_a_non_root_user(
    dockerfile: dict[str, list[tuple[str, str]]],
) -> None:
    runtime = dockerfile["runtime"]
    installs = [rest for kw, rest in runtime if kw == "RUN" and "pip install" in rest]
    assert installs and all("--no-index" in r and "from=builder" in r for r in installs)
    assert not copied_paths(runtime), "the runtime stage takes nothing from the build context"
    user = final_value(runtime, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) == 10001, "numeric non-root uid (runAsNonRoot can check it)"
    last_user_index = max(i for i, (kw, _) in enumerate(runtime) if kw == "USER")
    assert all(kw != "RUN" for kw, _ in runtime[last_user_index:]), "nothing runs as root after USER"
    assert any(re.search(r"useradd .*--uid 10001", rest) for kw, rest in runtime if kw == "RUN")


def test_entrypoint_is_prefixfleet_and_the_default_role_is_the_operator(
    dockerfile: dict[str, list[tuple[str, str]]],
) -> None:
    runtime = dockerfile["runtime"]
    assert json.loads(final_value(runtime, "ENTRYPOINT")) == ["prefixfleet"]
    assert json.loads(final_value(runtime, "CMD")) == ["operator", "run"]


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    assert {".git", ".venv", "tests", "**/__pycache__"} <= ignored
    for needed in ["pyproject.toml", "README.md", *{d.split("/")[0] for d in package_dirs()}]:
        assert needed not in ignored, needed


# ------------------------------------------------------------------ the install steps, replayed


def build_wheel(builder: list[tuple[str, str]], tmp_path: Path) -> Path:
    """Copy exactly what the builder stage copies and build the wheel the same way (offline)."""
    context = tmp_path / "src"
    context.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for source in copied_paths(builder):
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=ignore)
        else:
            shutil.copy2(src, context / source)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index"]
    subprocess.run([*build, "--wheel-dir", str(wheels), "."], cwd=context, check=True, capture_output=True)
    (wheel,) = wheels.glob("prefixfleet-*.whl")
    return wheel


def test_builder_steps_produce_a_wheel_that_runs_from_a_fresh_venv(
    tmp_path: Path, dockerfile: dict[str, list[tuple[str, str]]]
) -> None:
    """Copy exactly what the builder copies, build the wheel the same way, install it into a new
    venv and run the CLI there (dependencies come from the test venv: the sandbox is offline)."""
    missing = [p for p in copied_paths(dockerfile["builder"]) if not (ROOT / p).exists()]
    assert not missing, f"`docker build` would fail at COPY: {missing} not in the checkout"
    wheel = build_wheel(dockerfile["builder"], tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith("operator/") for n in names), "must not ship a top-level `operator` module"
    assert "prefixfleet/operator/models.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    subprocess.run([*pip, "install", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    # A path line in a .pth file adds the test venv's packages (the dependencies) after the wheel's own
    # site-packages; .pth files inside it are not processed, so the editable checkout stays out of reach.
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "deps.pth").write_text(site.getsitepackages()[0] + "\n")

    prefixfleet = venv / "bin" / "prefixfleet"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import prefixfleet.operator.models as m; print(m.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(str(venv)), f"imported from {where!r}, not from the installed wheel"
    helped = subprocess.run([str(prefixfleet), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert helped.returncode == 0, helped.stderr
    crd = subprocess.run([str(prefixfleet), "operator", "crd"], cwd=tmp_path, capture_output=True, text=True)
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == render_crd_yaml()


# ------------------------------------------------------------------ every referenced command exists


def subcommand(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser | None:
    """The parser of ``prefixfleet WORDS...``, or None when that subcommand is not registered."""
    for word in words:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or word not in actions[0].choices:
            return None
        parser = actions[0].choices[word]
    return parser


def roles_in_dockerfile() -> dict[str, list[str]]:
    """The role table in the Dockerfile's header comment: ``#   role: prefixfleet WORDS ...``."""
    roles = {}
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(
            r"^#\s+(\w+):\s+(?:\(default\)\s+)?prefixfleet\s+([a-z][a-z -]*?)(?:\s+\.\.\.)?$", line
        )
        if match:
            roles[match.group(1)] = match.group(2).split()
    return roles


def chart_commands() -> list[list[str]]:
    with helm_python.Chart.load(ROOT / "charts" / "prefixfleet") as chart:
        manifests = chart.render({"redis": {"enabled": True}}, name="prefixfleet", namespace="prefixfleet")
    commands = []
    for text in manifests.values():
        for doc in yaml.safe_load_all(text) if text.strip() and not text.startswith("prefixfleet ") else []:
            if doc and doc.get("kind") == "Deployment":
                for container in doc["spec"]["template"]["spec"]["containers"]:
                    if container.get("command") == ["prefixfleet"]:
                        commands.append(container["args"])
    return commands


def test_the_image_exposes_every_port_the_charts_operator_declares(
    dockerfile: dict[str, list[tuple[str, str]]],
) -> None:
    exposed = {int(p.split("/")[0]) for p in final_value(dockerfile["runtime"], "EXPOSE").split()}
    with helm_python.Chart.load(ROOT / "charts" / "prefixfleet") as chart:
        manifests = chart.render({}, name="prefixfleet", namespace="prefixfleet")
    (deployment,) = [d for d in yaml.safe_load_all(manifests["prefixfleet/templates/deployment.yaml"]) if d]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    declared = {port["containerPort"] for port in container["ports"]}
    assert declared == {8080, 8081}  # liveness and metrics
    assert declared <= exposed


def test_the_dockerfile_documents_every_role() -> None:
    assert roles_in_dockerfile() == {
        "operator": ["operator", "run"],
        "gateway": ["router", "gateway"],
        "sidecar": ["router", "sidecar"],
        "emulator": ["emulator"],
    }


REFERENCED = {
    **{f"dockerfile role {k}": v for k, v in roles_in_dockerfile().items()},
    "dockerfile CMD": ["operator", "run"],
    **{f"chart: prefixfleet {' '.join(a[:2])}": a for a in chart_commands()},
}


@pytest.mark.parametrize("argv", REFERENCED.values(), ids=REFERENCED.keys())
def test_every_referenced_command_exists_in_the_cli(argv: list[str]) -> None:
    parser = build_parser()
    words = [a for a in argv if not a.startswith("-")][:2]
    words = words[:1] if words[0] == "emulator" else words
    assert subcommand(parser, words) is not None, f"`prefixfleet {' '.join(words)}` is not a command"
    if any(a.startswith("-") for a in argv):  # the exact arguments the chart passes must parse
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"`prefixfleet {' '.join(argv)}` is refused by the CLI (exit {exc.code})")
