"""Every ``--set`` example a command's help prints works for the workload or scenario it names.

`prefixfleet sim-autoscale --help` showed ``speedup=8``, which only a trace scenario takes (viral and
diurnal have no speedup), and `prefixfleet load --help` ``limit=1000, block_tokens=64``, trace
settings too, with nothing saying so. Each example now names the workload or scenario it is for, its
keys are checked against that one's settings when the parser is built, and a command with a default
(up: prefixroute, compare: the Mooncake trace) shows an example for that default.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from prefixfleet.cli import build_parser
from prefixfleet.sim.scenarios import build_scenario
from prefixfleet.sim.workloads import build_workload, settings_help

TRACE_LINE = '{"timestamp": %d, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
BUILDERS = {"sim": build_workload, "up": build_workload, "load": build_workload, "compare": build_workload}
BUILDERS["sim-autoscale"] = build_scenario
# the workload a command runs when none is given (sim, load and sim-autoscale require one)
DEFAULT_SPEC = {"up": "prefixroute", "compare": "trace:PATH"}


def examples(command: str) -> dict[str, dict[str, str]]:
    """The ``--set`` help's examples, ``{spec: {key: value}}``."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (action,) = [a for a in sub.choices[command]._actions if "--set" in a.option_strings]
    text = " ".join((action.help or "").split())
    shown = re.search(r"\(e\.g\. (.*?)\)\.", text)
    assert shown, text
    out = {}
    for part in shown.group(1).split("; "):
        named = re.fullmatch(r"for (\S+): (.+)", part)
        assert named, f"{command}: example {part!r} names no workload or scenario"
        out[named.group(1)] = dict(pair.split("=", 1) for pair in named.group(2).split(", "))
    return out


@pytest.mark.parametrize("command", sorted(BUILDERS))
def test_every_help_example_is_accepted_by_what_it_names(command: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(TRACE_LINE % t for t in range(3)))
    shown = examples(command)
    if command in DEFAULT_SPEC:
        assert DEFAULT_SPEC[command] in shown, shown
    for spec, settings in shown.items():
        built = BUILDERS[command](spec.replace("PATH", str(trace)), **settings)
        assert built.requests, (command, spec, settings)


def test_an_example_key_the_workload_lacks_is_refused_when_the_help_is_built() -> None:
    with pytest.raises(ValueError, match=r"^--set help example: scenario 'viral' has no setting 'speedup'$"):
        settings_help("scenario", {"viral": "duration_s=300, speedup=8"})
    with pytest.raises(
        ValueError, match=r"^--set help example: workload 'prefixroute' has no setting 'limit'$"
    ):
        settings_help("workload", {"prefixroute": "limit=1000"})
