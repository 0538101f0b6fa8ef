"""The install docs say how to uninstall, and the commands they give work.

docs/operator.md told how to install and upgrade the chart, not how to remove it. Every fleet carries
the operator's finalizer, so the obvious order — `helm uninstall`, then `kubectl delete pcf` (or
deleting the fleet's namespace) — hangs forever and leaves the fleet's pods (GPUs) running: nothing is
left to remove the finalizer. Specification: the docs give the order that works (fleets first, while
the operator runs, then `helm uninstall` of the release the docs installed) and the way out of the
stuck state (the finalizer patch), and both do what is said against the emulated API server with the
real kubectl and `prefixfleet operator run`.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from prefixfleet.operator.handlers import FINALIZER
from tests.k8s.cluster import EmulatedCluster, emulator_fleet, operator_in_cluster, running_redis, wait_for

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "operator.md"
NAMESPACE = "default"


def shell_lines() -> list[str]:
    """Every command of the page's sh blocks, one per line (continuations joined)."""
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S)
    return [
        line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()
    ]


def commands(prefix: str) -> list[list[str]]:
    return [shlex.split(line.split(" #")[0]) for line in shell_lines() if line.startswith(prefix)]


def documented(prefix: str) -> list[str]:
    found = commands(prefix)
    assert len(found) == 1, f"docs/operator.md: expected one `{prefix} ...` command, found {found}"
    return found[0]


def kubectl_args(argv: list[str], **placeholders: str) -> list[str]:
    assert argv[0] == "kubectl"
    return [placeholders.get(word, word) for word in argv[1:]]


def test_the_docs_uninstall_the_release_they_install() -> None:
    uninstall = documented("helm uninstall ")
    installs = commands("helm install ")
    assert installs, "docs/operator.md installs nothing"
    for install in installs:  # the plain and the OpenShift install: one release, one namespace
        release, namespace = install[2], install[install.index("-n") + 1]
        assert uninstall == ["helm", "uninstall", release, "-n", namespace]
    # the fleets go first: the uninstall comes after their deletion in the page
    lines = shell_lines()
    assert lines.index(shlex.join(documented("kubectl delete pcf"))) < lines.index(shlex.join(uninstall))
    # the stuck fleet's finalizer is named as the operator sets it
    assert f"`{FINALIZER}`" in DOC.read_text()


def fleet(cluster: EmulatedCluster, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", "pcf", name, "-n", NAMESPACE, "-o", "json", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr or "not found" in result.stderr, result.stderr
        return None
    return json.loads(result.stdout)


def has_finalizer(cluster: EmulatedCluster, name: str) -> bool:
    obj = fleet(cluster, name)
    return obj is not None and FINALIZER in (obj["metadata"].get("finalizers") or [])


def test_the_documented_commands_delete_fleets_before_and_after_the_operator_is_gone(tmp_path: Path) -> None:
    delete_all = documented("kubectl delete pcf")
    unstick = documented("kubectl patch pcf")
    with (
        running_redis(tmp_path) as url,
        operator_in_cluster(tmp_path, url, kubelet=False) as (cluster, operator),
    ):
        for name in ("first", "late"):
            cluster.apply(emulator_fleet(name, NAMESPACE, {"url": url}))
            wait_for(
                lambda name=name: has_finalizer(cluster, name), 60, what=f"the operator's finalizer on {name}"
            )

        # the documented order, while the operator runs: the fleets go, kubectl returns
        cluster.kubectl(*kubectl_args(delete_all), "--timeout=60s", timeout=90)
        assert fleet(cluster, "first") is None and fleet(cluster, "late") is None

        # the stuck state: a fleet deleted after the operator is gone (helm uninstall) stays
        cluster.apply(emulator_fleet("late", NAMESPACE, {"url": url}))
        wait_for(lambda: has_finalizer(cluster, "late"), 60, what="the operator's finalizer on the new fleet")
        operator.stop()
        stuck = cluster.kubectl("delete", "pcf", "late", "-n", NAMESPACE, "--wait=false")
        assert stuck.returncode == 0
        obj = fleet(cluster, "late")
        assert obj is not None and obj["metadata"].get("deletionTimestamp"), (
            "deleted at once: nothing to document"
        )
        assert obj["metadata"]["finalizers"] == [FINALIZER]

        # the documented way out
        cluster.kubectl(*kubectl_args(unstick, NAME="late", NAMESPACE=NAMESPACE))
        wait_for(lambda: fleet(cluster, "late") is None, 20, what="the fleet gone after the finalizer patch")
