"""A bad PREFIXFLEET_CLIENT_*_TIMEOUT_S is one usage line at start-up from every service that reads it.

The gateway and the sidecar checked the variables with their flags; the emulator read them only when
its server started, so ``PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S=abc prefixfleet emulator ...`` ended in a
traceback (and since the 1 s floor, so did ``0.5``). Specification: each of the three exits 2 with
one ``error:`` line naming the variable and the value, no traceback, before it listens.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from fleet_fixtures import free_port, prefixfleet_argv

pytestmark = pytest.mark.timeout(90)

SERVICES = {
    "emulator": ["emulator"],
    "sidecar": ["router", "sidecar", "--engine", "http://127.0.0.1:1"],
    "gateway": ["router", "gateway", "--worker", "http://127.0.0.1:1"],
}


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(
    ("variable", "raw", "says"),
    [
        ("PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S", "abc", "must be a number of seconds, got 'abc'"),
        ("PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S", "0.5", "must be at least 1 s"),
        ("PREFIXFLEET_CLIENT_BODY_TIMEOUT_S", "-3", "must be a positive number of seconds, got '-3'"),
    ],
)
def test_a_bad_client_timeout_variable_is_one_usage_line(
    service: str, variable: str, raw: str, says: str
) -> None:
    argv = prefixfleet_argv(*SERVICES[service], "--port", str(free_port()))
    done = subprocess.run(
        argv, env={**os.environ, variable: raw}, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert f"error: {variable} {says}" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
