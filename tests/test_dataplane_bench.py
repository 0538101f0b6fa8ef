"""`prefixfleet router bench-overhead` runs end to end and reports every path (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fleet_fixtures import prefixfleet_argv


def test_bench_overhead_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    done = subprocess.run(
        prefixfleet_argv("router", "bench-overhead", "--requests", "20", "--json", str(out), "--no-progress"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "added p50" in done.stdout and "gateway" in done.stdout
    report = json.loads(out.read_text())
    assert set(report["paths"]) == {"engine", "sidecar", "gateway"}
    assert all(row["errors"] == 0 for row in report["paths"].values())
    assert report["paths"]["engine"]["added_p50_ms"] == 0.0
    assert set(report["cpu_us_per_request"]) == {"engine", "sidecar", "gateway"}


def test_bench_overhead_measures_the_tenant_path_with_tenant_header(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    done = subprocess.run(
        prefixfleet_argv("router", "bench-overhead", "--requests", "10",
                         "--tenant-header", "X-Prefixfleet-Tenant", "--json", str(out), "--no-progress"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["tenant_header"] == "X-Prefixfleet-Tenant"
    # an isolating gateway refuses a request without its header: none was refused
    assert all(row["errors"] == 0 for row in report["paths"].values())


def test_bench_overhead_refuses_a_tenant_header_that_is_no_header_name() -> None:
    done = subprocess.run(
        prefixfleet_argv("router", "bench-overhead", "--tenant-header", "X Tenant", "--no-progress"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--tenant-header must be an HTTP header name" in done.stderr and "Traceback" not in done.stderr
