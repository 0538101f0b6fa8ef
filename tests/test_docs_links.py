"""Every relative link and #anchor in README.md and docs/*.md resolves.

A newcomer follows these links first; a renamed file or heading must fail here, not in their browser.
Anchors follow GitHub's heading slugs (lower case, punctuation dropped, spaces to hyphens, repeats
numbered -1, -2, ...).
"""

from __future__ import annotations

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
