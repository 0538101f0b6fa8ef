"""A service started on an address it cannot listen on says so in one line naming the flag and the
address (exit 2, no traceback), not the event loop's "[Errno 98] error while attempting to bind on
address ('127.0.0.1', 8080): address already in use"."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

PREFIXFLEET = [sys.executable, "-m", "prefixfleet.cli"]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


SERVICES = {
    "router gateway": ["router", "gateway", "--worker", "http://127.0.0.1:9"],
    "router sidecar": ["router", "sidecar", "--engine", "http://127.0.0.1:9", "--no-self-register"],
    "emulator": ["emulator"],
}


def _refusal(argv: list[str]) -> str:
    done = subprocess.run([*PREFIXFLEET, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done
    assert "Traceback" not in done.stderr and "Errno" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


@pytest.mark.parametrize("name", SERVICES)
def test_a_port_in_use_names_the_flag_and_the_address(name: str, busy_port: int) -> None:
    line = _refusal([*SERVICES[name], "--port", str(busy_port)])
    assert line == (
        f"prefixfleet {name}: error: --port {busy_port}: address 127.0.0.1:{busy_port} is already in use"
    )


@pytest.mark.parametrize("name", ["router gateway", "emulator"])
def test_an_address_not_on_this_host_names_the_host_flag(name: str) -> None:
    # 192.0.2.1 (TEST-NET-1) is assigned to no interface here: EADDRNOTAVAIL
    line = _refusal([*SERVICES[name], "--port", "18999", "--host", "192.0.2.1"])
    assert line == (
        f"prefixfleet {name}: error: --host '192.0.2.1': cannot listen on 192.0.2.1:18999: "
        "Cannot assign requested address"
    )
