"""Every command that takes ``--set KEY=VALUE`` says where the keys are and the caps they are held to.

`prefixfleet up --help` (and compare, load) said only "workload setting": nothing told a user which
keys exist or that a setting is capped (10,000 tenants, 1e8 tokens of shared prefixes, 2e9 prompt
tokens...) until a refusal did. The help now comes from one place (sim.workloads.settings_help), its
numbers from the caps themselves, and the docs it points to exist and quote the same caps.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from prefixfleet.cli import build_parser
from prefixfleet.sim.workloads import (
    MAX_PREFIX_TOKENS,
    MAX_PREFIXES,
    MAX_SETTING_TOKENS,
    MAX_WORKLOAD_REQUESTS,
    MAX_WORKLOAD_TOKENS,
)

ROOT = Path(__file__).resolve().parents[1]
CAPS = [f"{cap:,}" for cap in (MAX_WORKLOAD_REQUESTS, MAX_WORKLOAD_TOKENS, MAX_PREFIXES, MAX_PREFIX_TOKENS)]
CAPS.append(f"{MAX_SETTING_TOKENS:,}")


def set_help(command: str) -> str:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (action,) = [a for a in sub.choices[command]._actions if "--set" in a.option_strings]
    return " ".join((action.help or "").split())


@pytest.mark.parametrize("command", ["up", "compare", "load", "sim", "sim-autoscale"])
def test_the_set_help_names_the_keys_source_and_every_cap(command: str) -> None:
    text = set_help(command)
    assert [cap for cap in CAPS if cap not in text] == [], text
    assert "an unknown key lists" in text.lower(), text
    docs = re.findall(r"docs/[\w-]+\.md", text)
    assert "docs/simulator.md" in docs, text
    for doc in docs:  # what it points to exists
        assert (ROOT / doc).is_file(), doc


def test_the_limits_the_help_points_to_are_the_codes() -> None:
    text = " ".join((ROOT / "docs" / "simulator.md").read_text().split())
    assert [cap for cap in CAPS if cap not in text] == []
