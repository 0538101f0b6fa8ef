"""`operator run --metrics-addr/--metrics-port` that cannot be resolved or bound is refused up front in
one line naming the flag (exit 2); it used to start the operator with only a logged warning, so the
autoscaler's metrics were silently missing."""

from __future__ import annotations

import pytest

from prefixfleet.cli import main
from tests.test_cli_listen_errors import busy_port  # noqa: F401  (a fixture)

RUN = ["operator", "run", "--metrics-port", "18123"]


@pytest.mark.parametrize(
    ("addr", "said"),
    [
        ("nothost.invalid", "--metrics-addr 'nothost.invalid': not an address this host can listen on: "),
        ("[::]", "(an IPv6 address goes unbracketed, e.g. ::)"),
        ("", "--metrics-addr is empty; give an address to bind, e.g. 0.0.0.0 (or :: for IPv6)"),
        ("192.0.2.1", "--metrics-addr '192.0.2.1': cannot listen on 192.0.2.1:18123: Cannot assign"),
    ],
)
def test_an_address_that_cannot_be_used_is_one_line(
    addr: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*RUN, "--metrics-addr", addr]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("prefixfleet operator run: error: ")
    assert said in err, err


def test_a_metrics_port_in_use_names_the_port_flag(
    busy_port: int,  # noqa: F811  (the fixture imported above)
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["operator", "run", "--metrics-port", str(busy_port), "--metrics-addr", "127.0.0.1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"prefixfleet operator run: error: --metrics-port {busy_port}: "
        f"address 127.0.0.1:{busy_port} is already in use\n"
    )


def test_usable_addresses_pass() -> None:
    from prefixfleet.operator.run import metrics_listen_problem

    for addr in ("0.0.0.0", "127.0.0.1", "localhost"):
        assert metrics_listen_problem(addr, 0) is None  # port 0: any free port, only the address matters
