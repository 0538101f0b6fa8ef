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


def _leaves(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    return [(name, p) for name, p in _commands(parser, ["prefixfleet"]) if not any(
        isinstance(a, argparse._SubParsersAction) for a in p._actions
    )]  # fmt: skip


def _shown_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return " ".join(parser._get_formatter()._expand_help(action).split()) if action.help else ""


def test_every_flag_has_help_that_shows_its_numeric_default() -> None:
    # `router gateway --help` listed --refresh-interval, --max-retries, --block-tokens ... with no word
    # and no default: the values were only in docs/gateway.md
    problems = []
    for name, parser in _leaves(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
                continue
            flag = action.option_strings[-1]
            text = _shown_help(parser, action)
            if not text:
                problems.append(f"{name} {flag}: no help")
                continue
            value = action.default
            if isinstance(value, int | float) and not isinstance(value, bool):
                forms = {str(value), f"{value:g}", f"{value:,}"}
                if not any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text) for f in forms):
                    problems.append(f"{name} {flag}: default {value} not shown ({text!r})")
    assert problems == []
