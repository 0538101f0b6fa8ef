"""argparse's own refusals are one line too, like every other bad input (exit 2, no usage block).

A typo'd choice (`--service gpu`), an unknown flag or a missing required one printed argparse's
usage block (up to 10 lines for `sim-autoscale`) before the line that says what is wrong; the
project's rule (tests/test_cli_badinput_sweep.py) is one line naming it. `--help` still has the usage.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import main


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["sim", "--workload", "chat", "--service", "gpu"],
            "prefixfleet sim: error: argument --service: invalid choice: 'gpu' "
            "(choose from 'fifo', 'batched', 'emulator')",
        ),
        (
            ["load", "--target", "http://127.0.0.1:9", "--workload", "gsp", "--api", "grpc"],
            "prefixfleet load: error: argument --api: invalid choice: 'grpc' "
            "(choose from 'openai', 'sglang')",
        ),
        (
            ["sim-autoscale"],
            "prefixfleet sim-autoscale: error: the following arguments are required: --scenario",
        ),
        (
            ["router", "gateway"],
            "prefixfleet router gateway: error: the following arguments are required: --port",
        ),
        (
            ["sim", "--workload", "chat", "--polcy", "x"],
            "prefixfleet: error: unrecognized arguments: --polcy x",
        ),
        (
            ["sim", "--replicas", "four"],
            "prefixfleet sim: error: argument --replicas: invalid int value: 'four'",
        ),
        (["nosuch"], "prefixfleet: error: argument COMMAND: invalid choice: 'nosuch'"),
    ],
)
def test_an_argparse_refusal_is_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line), err


def test_help_still_shows_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage: prefixfleet sim ")


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["router", "gateway", "--port", "99999"], "prefixfleet router gateway: error: --port"),
        (["chaos", "soak", "--rate", "0"], "prefixfleet chaos soak: error: --rate"),
        (["operator", "validate", "/nonexistent.yaml"], "prefixfleet operator validate: error: cannot read"),
        (["bench", "tree", "--ops", "0", "--quiet"], "prefixfleet bench tree: error: ops"),
        (["sim", "--workload", "nope"], "prefixfleet sim: error: unknown workload"),
    ],
)
def test_a_usage_error_names_the_whole_subcommand_as_argparse_does(
    argv: list[str], start: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse's own refusals say `prefixfleet router gateway: error:`; the command's checks said
    # `prefixfleet router: error:` for the same command
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(start), err


@pytest.mark.parametrize(
    ("argv", "prog", "metavar", "some"),
    [
        ([], "prefixfleet", "COMMAND", ("sim", "operator", "router")),
        (["operator"], "prefixfleet operator", "SUBCOMMAND", ("run", "validate", "crd")),
        (["router"], "prefixfleet router", "SERVICE", ("sidecar", "gateway")),
    ],
)
def test_a_missing_subcommand_names_the_ones_there_are(
    argv: list[str], prog: str, metavar: str, some: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    # before ca70bee the usage block listed them ({sim,sim-autoscale,...}); after it, bare
    # `prefixfleet` said only "the following arguments are required: COMMAND"
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: the following arguments are required: {metavar} (one of "), err
    assert all(f" {name}," in err or f" {name};" in err for name in some), err
    assert f"'{prog} --help'" in err
