"""The fleet's child entry point (``python -m prefixfleet.fleet.child``) refuses bad input exactly as
``prefixfleet`` does: one line ``prefixfleet <subcommand>: error: ...`` (the whole subcommand, as
since 0a267ab), exit 2, and imports only the command's own module."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest

from prefixfleet.cli import COMMAND_OWNERS, main
from prefixfleet.fleet import child
from tests.test_cli_listen_errors import busy_port  # noqa: F401  (a fixture)


def _status(entry: Callable[[Sequence[str]], int], argv: list[str]) -> int:
    try:
        return entry(argv)
    except SystemExit as exc:  # argparse's own refusals exit
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["router", "gateway", "--port", "0", "--redis", "redis://h"], "prefixfleet router gateway: error: "),
        (["router", "sidecar", "--port", "1", "--engine", "ftp://x"], "prefixfleet router sidecar: error: "),
        (["emulator", "--port", "1", "--max-running", "x"], "prefixfleet emulator: error: argument"),
        (["emulator", "--port", "1", "--time-scale", "0"], "prefixfleet emulator: error: --time-scale"),
    ],
)
def test_a_child_refuses_as_the_cli_does(
    argv: list[str], start: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _status(main, argv) == 2
    expected = capsys.readouterr().err
    assert _status(child.main, argv) == 2
    got = capsys.readouterr().err
    assert got == expected and got.startswith(start) and got.count("\n") == 1, got


def test_each_child_command_imports_only_its_module() -> None:
    assert all(name in COMMAND_OWNERS for name in child.COMMANDS)
    code = (
        "import sys; from prefixfleet.fleet import child;"
        "child.main(['router', 'gateway', '--port', '0', '--worker', 'http://h:9']);"
        "print('prefixfleet.sim.cli' in sys.modules, 'prefixfleet.operator.cli' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False False", done


def test_a_child_on_a_taken_port_says_so_in_one_line(busy_port: int) -> None:  # noqa: F811
    # what `up` shows in its log tail when a port it picked was taken before the child bound it
    for argv, name in (
        (["router", "gateway", "--worker", "http://127.0.0.1:9"], "router gateway"),
        (["emulator"], "emulator"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "prefixfleet.fleet.child", *argv, "--port", str(busy_port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert done.stderr == (
            f"prefixfleet {name}: error: --port {busy_port}: "
            f"address 127.0.0.1:{busy_port} is already in use\n"
        )
