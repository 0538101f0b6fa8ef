"""A real Prometheus (Debian's ``prometheus`` binary) scraping a local fleet on 127.0.0.1.

For the observability tests and for rendering the docs' pictures from a real run. The scrape
configuration gives each target the labels the chart's monitors give it in Kubernetes: ``namespace``,
``fleet`` and ``pod`` (the replica's worker id for engines scraped through their sidecar, the gateway's
name for gateways), so the dashboard's queries and the alert rules read a local fleet unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    job: str  # "prefixfleet-gateway" or "prefixfleet-replica"
    url: str  # http://127.0.0.1:PORT (its /metrics is scraped)
    pod: str


def scrape_config(
    targets: Iterable[ScrapeTarget],
    *,
    fleet: str,
    namespace: str = "local",
    interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> dict[str, Any]:
    """A prometheus.yml (as data): one static target group per target, labelled like in Kubernetes."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in targets:
        host = t.url.removeprefix("http://").rstrip("/")
        labels = {"namespace": namespace, "fleet": fleet, "pod": t.pod}
        jobs.setdefault(t.job, []).append({"targets": [host], "labels": labels})
    interval = f"{max(int(interval_s * 1000), 100)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": groups}
            for job, groups in jobs.items()
        ],
    }


class PrometheusNotFound(RuntimeError):
    pass


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if not found:
        raise PrometheusNotFound(
            "prometheus is not on PATH: install Debian's package "
            "(apt-get update && apt-get install -y prometheus)"
        )
    return found


class LocalPrometheus:
    """One Prometheus process with its config and TSDB in ``directory``; stop() ends it (and only it)."""

    def __init__(self, directory: Path, port: int, config: Mapping[str, Any]) -> None:
        self.directory = directory
        self.port = port
        self.config_path = directory / "prometheus.yml"
        self.log_path = directory / "prometheus.log"
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def argv(self) -> list[str]:
        return [
            prometheus_binary(),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.directory / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ]

    def start(self, timeout_s: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as r,
            ):
                if r.status == 200 and self._answering_is_ours():
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus not ready within {timeout_s} s:\n{self.log()[-3000:]}")

    def _answering_is_ours(self) -> bool:
        """Whether the server that answered on our port runs our config; raises (after stopping
        ours) when another one holds the port: its answers would pass for ours."""
        try:
            running = self.api("status/flags").get("data", {}).get("config.file")
        except (OSError, urllib.error.URLError, ValueError):
            return False  # not answering its API yet: poll again
        if running == str(self.config_path):
            return True
        self.stop()
        raise RuntimeError(
            f"port {self.port} on {LOOPBACK} is already served by another Prometheus "
            f"(config {running!r}): stop it or choose another port"
        )

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """``GET /api/v1/<path>`` as JSON; a 400/422 (a PromQL error) is returned as its JSON too."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
