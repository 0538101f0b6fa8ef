"""Ctrl-C and SIGTERM at the phases of `prefixfleet up` that run before the fleet exists: one line and
exit status 130, never a traceback, and no process left."""

from __future__ import annotations

import pytest

import prefixfleet.cli as cli


def test_ctrl_c_while_the_command_module_imports_is_one_line(monkeypatch, capsys) -> None:
    # Building the parser imports the command's module: seconds on a busy machine (`prefixfleet up`
    # took 2.5 s there), long enough for a Ctrl-C, which printed the import's traceback.
    def interrupted(only: str | None = None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["up", "--requests", "10"]) == 130
    assert capsys.readouterr().err == "prefixfleet up: interrupted\n"
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "prefixfleet: interrupted\n"


@pytest.mark.parametrize("argv", [["--help"], ["no-such-command"]])
def test_ctrl_c_before_a_command_is_known_names_the_program_only(argv, monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "build_parser", lambda only=None: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert cli.main(argv) == 130
    assert capsys.readouterr().err == "prefixfleet: interrupted\n"
