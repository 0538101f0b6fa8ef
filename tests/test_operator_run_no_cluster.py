"""`prefixfleet operator run` with no Kubernetes to talk to says so in one line and exits 2.

Before, kopf started anyway: its `configure` activity logged the kubernetes loader's two chained
tracebacks and retried every 60 s for ever (a newcomer trying the operator on a laptop, or a typo'd
KUBECONFIG). In a pod the service account is found and nothing changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PREFIXFLEET = str(Path(sys.executable).parent / "prefixfleet")


# YAML the kubernetes loader cannot read, and YAML that is no kubeconfig: a list, a string, a
# section of the wrong type, a context that is no mapping (each raised TypeError or AttributeError
# from inside the loader: a traceback and exit 1)
BROKEN = {
    "broken": "clusters: [unclosed",
    "a-list": "[1, 2]",
    "a-string": "just some text",
    "contexts-not-a-list": "contexts: 5",
    "context-not-a-mapping": "current-context: x\ncontexts: [{name: x, context: 5}]",
}


@pytest.mark.parametrize("kubeconfig", ["missing", *BROKEN])
def test_no_kubeconfig_and_no_service_account_is_one_line(tmp_path: Path, kubeconfig: str) -> None:
    path = tmp_path / "config"
    if kubeconfig in BROKEN:
        path.write_text(BROKEN[kubeconfig])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
    env.update(HOME=str(tmp_path), KUBECONFIG=str(path))
    try:
        result = subprocess.run(
            [PREFIXFLEET, "operator", "run", "--metrics-port", "0"],
            capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the operator kept running without any cluster to talk to")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0].startswith("prefixfleet operator run: error: no Kubernetes API to talk to: ")
    assert str(path) in lines[0]
