"""The `helm install` commands the README and docs/operator.md show render with the chart as written.

The chart's values.schema.json refuses unknown keys, so a misspelt `--set` in the README would fail a
newcomer's first install; the tests render other value sets. This takes each documented command's
release, namespace and `--set` values (parsed by Helm's own --set parser) and renders the chart:
no refusal, and the operator runs the image the command names.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "prefixfleet"


def helm_installs() -> list[tuple[str, list[str]]]:
    found = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "operator.md"):
        text = doc.read_text().replace("\\\n", " ")  # shell line continuations
        for line in text.splitlines():
            if line.startswith("helm install "):
                found.append((doc.name, shlex.split(line.split(" #")[0])))
    return found


def test_the_docs_show_helm_installs() -> None:
    assert {doc for doc, _ in helm_installs()} == {"README.md", "operator.md"}


@pytest.mark.parametrize(("doc", "argv"), helm_installs(), ids=lambda x: x if isinstance(x, str) else "")
def test_a_documented_helm_install_renders(doc: str, argv: list[str]) -> None:
    release, chart = argv[2], argv[3]
    assert (ROOT / chart).resolve() == CHART.resolve(), f"{doc}: installs {chart}"
    namespace = argv[argv.index("-n") + 1] if "-n" in argv else "default"
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    values: dict[str, Any] = helm_python.parse_set_string(",".join(sets)) if sets else {}
    with helm_python.Chart.load(CHART) as loaded:
        manifests = loaded.render(values, name=release, namespace=namespace)
    objects = [
        d
        for path, t in manifests.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(t)
        if d
    ]
    (operator,) = [o for o in objects if o["kind"] == "Deployment" and "operator" in o["metadata"]["name"]]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    image = values.get("image", {})
    repository = image.get("repository", "ghcr.io/prefixfleet/prefixfleet")
    assert re.fullmatch(
        rf"{re.escape(repository)}:{re.escape(image.get('tag', '0.1.0'))}", container["image"]
    )
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("PREFIXFLEET_IMAGE") == container["image"], "the fleets' pods would run another image"
    if values.get("redis", {}).get("enabled"):
        assert env.get("PREFIXFLEET_REDIS_URL") == f"redis://{release}-redis.{namespace}.svc:6379/0"
