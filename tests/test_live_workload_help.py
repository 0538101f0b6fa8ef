"""`prefixfleet up` and `prefixfleet load` accept every workload the simulator has, and say so.

Their --workload help listed prefixroute, lab-burst, gsp, chat and trace:PATH while `viral` was
taken too (`prefixfleet up --workload viral` runs): a newcomer reading --help could not know.
"""

from __future__ import annotations

import argparse

import pytest

from prefixfleet.cli import build_parser
from prefixfleet.sim.workloads import WORKLOADS


def _workload_help(command: str) -> str:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (action,) = [a for a in sub.choices[command]._actions if "--workload" in a.option_strings]
    return action.help or ""


@pytest.mark.parametrize("command", ["up", "load"])
def test_the_workload_help_names_every_workload(command: str) -> None:
    text = _workload_help(command)
    assert [w for w in WORKLOADS if w not in text] == [], text
