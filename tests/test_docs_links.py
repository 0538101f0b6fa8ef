"""Every relative link and #anchor in README.md and docs/*.md resolves, and every `prefixfleet ...`
command they show uses only flags that command has.

A newcomer follows these links and copies these commands first; a renamed file, heading or flag
must fail here, not in their browser or shell. Anchors follow GitHub's heading slugs (lower case,
punctuation dropped, spaces to hyphens, repeats numbered -1, -2, ...). Commands are read from
fenced blocks and code spans; placeholders (`--seed N`) and omitted required flags are allowed,
an unknown `--flag` is not.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target); the target stops at whitespace (an optional "title" follows).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
FENCED_LINES = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.M | re.S)
# `prefixfleet` + subcommand words, then its arguments up to a shell operator or the end
COMMAND = re.compile(r"(?:^|[\s(])(?:\.venv/bin/)?prefixfleet((?:\s+[a-z][a-z0-9-]*)+)((?:\s+[^\s|;&]+)*)")


def _prose(text: str) -> str:
    """The text without fenced blocks and code spans (a link shown as code is not a link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a linked heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps unicode letters and digits, as GitHub does
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found: set[str] = set(HTML_ID.findall(text))
    for heading in HEADING.findall(text):
        slug = github_slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(_prose(path.read_text(encoding="utf-8")))


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no such file {dest.relative_to(root)}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


def test_the_slugs_are_githubs():
    assert github_slug("`prefixfleet compare`") == "prefixfleet-compare"
    assert github_slug("1. Faults under load") == "1-faults-under-load"
    assert github_slug("Scaling the Mooncake trace down (`compare`, and `up`/`load`)") == (
        "scaling-the-mooncake-trace-down-compare-and-upload"
    )
    assert github_slug("Why `queue_aware` looks like it does") == "why-queue_aware-looks-like-it-does"


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Part two\n\nSee [b](b.md) and [x](#part-two).\n")
    doc = tmp_path / "b.md"
    doc.write_text("[a](a.md#part-two) [gone](a.md#part-three) [none](c.md) `[code](d.md)`\n")
    assert broken_links(doc, root=tmp_path) == [
        "a.md#part-three: no heading #part-three in a.md",
        "c.md: no such file c.md",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
    assert broken_links(doc) == []


def command_snippets(text: str) -> list[str]:
    """Lines of fenced blocks and code spans, without shell comments."""
    lines = [line for m in FENCED_LINES.finditer(text) for line in m.group(2).splitlines()]
    lines += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", FENCED_LINES.sub("", text))
    return [line.split(" #")[0] for line in lines]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_flags(text: str, parser: argparse.ArgumentParser) -> list[str]:
    problems = []
    for snippet in command_snippets(text):
        for m in COMMAND.finditer(snippet):
            words, rest = m.group(1).split(), m.group(2).split()
            command, path = parser, []
            for i, word in enumerate(words):
                sub = _subcommands(command)
                if word not in sub:
                    rest = words[i:] + rest
                    break
                command, path = sub[word], [*path, word]
            if not path:
                continue
            known = {flag for action in command._actions for flag in action.option_strings}
            for token in rest:
                flag = token.strip("[]`,.;:()").split("=")[0]
                if flag.startswith("--") and len(flag) > 2 and flag not in known:
                    problems.append(f"prefixfleet {' '.join(path)}: no flag {flag} ({snippet.strip()})")
    return problems


@pytest.fixture(scope="module")
def cli_parser() -> argparse.ArgumentParser:
    from prefixfleet.cli import build_parser

    return build_parser()


def test_the_flag_checker_finds_an_unknown_flag_and_allows_placeholders(cli_parser):
    text = (
        "```sh\nprefixfleet up --policies all --no-such-flag 1   # --not-this-one\n```\n"
        "Run `prefixfleet sim-autoscale --scenario viral|diurnal --seed N` or "
        "`.venv/bin/prefixfleet router gateway --port 8000 --polcy x`.\n"
    )
    assert unknown_flags(text, cli_parser) == [
        "prefixfleet up: no flag --no-such-flag (prefixfleet up --policies all --no-such-flag 1)",
        "prefixfleet router gateway: no flag --polcy"
        " (.venv/bin/prefixfleet router gateway --port 8000 --polcy x)",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_uses_only_flags_it_has(doc, cli_parser):
    assert unknown_flags(doc.read_text(encoding="utf-8"), cli_parser) == []
