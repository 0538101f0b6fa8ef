"""Every command's --help reads as plain text: no reST markup from a module docstring.

`prefixfleet report --help` and `prefixfleet bench tree --help` showed their module docstrings as
written for Sphinx (``--fleet``, :mod:`.dashboard`, ``lab_ops``), naming code where a user looks
for flags.
"""

from __future__ import annotations

import argparse
import re

from prefixfleet.cli import build_parser

MARKUP = re.compile(r"``|:(?:mod|func|meth|class|attr|data):`")


def _commands(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(" ".join(path), parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, [*path, name])
    return found


def test_no_help_shows_rest_markup() -> None:
    commands = _commands(build_parser(), ["prefixfleet"])
    assert len(commands) > 20
    marked = {name: MARKUP.findall(p.format_help()) for name, p in commands}
    assert {name: m for name, m in marked.items() if m} == {}
