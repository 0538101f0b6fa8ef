"""Defaults the docs quote are the code's.

tests/test_docs_links.py checks that a documented flag exists; this checks what it does not: the
flag tables (`| flag | default | meaning |`) of docs/gateway.md and docs/emulator.md list every flag
of their command with the default argparse really gives it, the chart table of docs/operator.md
names only values that values.yaml (with its scalar defaults) and values.schema.json have, and the
sidecar's load-push gap quoted in prose is the configured one. A newcomer reads these tables
instead of `--help`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixfleet.cli import build_parser
from prefixfleet.router.sidecar import SidecarConfig

ROOT = Path(__file__).resolve().parents[1]
TABLE = re.compile(r"(?:^\|.*\|[ \t]*\n)+", re.M)
FLAG = re.compile(r"--[a-z][a-z0-9-]*")
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """Every Markdown table as (the heading above it, its rows of cells without the header)."""
    found = []
    for m in TABLE.finditer(text):
        headings = re.findall(r"^#+\s+(.*)$", text[: m.start()], re.M)
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in m.group(0).splitlines()]
        found.append((headings[-1] if headings else "", rows))
    return found


def flag_table(doc: str, heading: str) -> list[list[str]]:
    (rows,) = [r for h, r in tables((ROOT / doc).read_text()) if heading in h and r[0][0] == "flag"]
    return rows[2:]


def command(words: list[str]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in words:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[word]
    return parser


def literal(cell: str) -> Any:
    """A documented default as a value when it is one (`16`, `0.25`, `16 MiB`, `` `main` ``); else None."""
    cell = cell.strip().strip("`")
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB)", cell):
        return float(m.group(1)) * UNITS[m.group(2)]
    try:
        return float(cell)
    except ValueError:
        return cell if re.fullmatch(r"[\w.:-]+", cell) else None


def same(documented: Any, actual: Any) -> bool:
    if isinstance(documented, float):
        return isinstance(actual, int | float) and not isinstance(actual, bool) and documented == actual
    if documented in ("none", "off"):  # a flag that is unset unless given
        return actual in (None, "", []) or actual is False
    return documented == str(actual) or (documented in ("on", "off") and actual == (documented == "on"))


CASES = [
    ("docs/gateway.md", "`prefixfleet router sidecar`", ["router", "sidecar"]),
    ("docs/gateway.md", "`prefixfleet router gateway`", ["router", "gateway"]),
    ("docs/emulator.md", "Flags and defaults", ["emulator"]),
]
UNDOCUMENTED_OK = {"-h", "--help"}


@pytest.mark.parametrize(("doc", "heading", "words"), CASES, ids=lambda c: str(c))
def test_a_flag_table_lists_every_flag_with_its_real_default(
    doc: str, heading: str, words: list[str]
) -> None:
    parser = command(words)
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    documented: set[str] = set()
    wrong = []
    for row in flag_table(doc, heading):
        flags = FLAG.findall(row[0])
        documented.update(flags)
        # `--port P` / `--host H` | required / 127.0.0.1: one default per flag when they pair up
        defaults = [d.strip() for d in row[1].split(" / ")]
        if len(defaults) != len(flags):
            defaults = [row[1]] * len(flags)
        for flag, cell in zip(flags, defaults, strict=True):
            action = by_flag.get(flag)
            assert action is not None, f"{doc}: {flag} is no flag of prefixfleet {' '.join(words)}"
            if cell == "required":
                if not action.required:
                    wrong.append(f"{flag}: documented required, is optional")
                continue
            value = literal(cell)
            if value is not None and not same(value, action.default):
                wrong.append(f"{flag}: documented {cell}, default is {action.default!r}")
    missing = sorted(set(by_flag) - documented - UNDOCUMENTED_OK)
    assert not missing, f"{doc} ({heading}): no row for {missing}"
    assert not wrong, f"{doc} ({heading}): {wrong}"


def test_the_checker_reads_units_and_names() -> None:
    assert literal("16 MiB") == 16 * 1024**2 and literal("`200000`") == 200000.0
    assert literal("`main`") == "main" and literal("the engine's `max_total_num_tokens`") is None
    assert same(0.25, 0.25) and not same(20.0, 0.05) and same("on", True) and not same(1.0, True)
    assert same("none", []) and same("off", None) and not same("none", 3) and not same("off", True)


def _values_key(values: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _row_keys(row: list[str]) -> list[str]:
    """The values a chart-table row names: `redis.image`, `port`, `maxMemory` are siblings of the
    first one (redis.port, redis.maxMemory); `nameOverride` / `fullnameOverride` are top-level."""
    keys = re.findall(r"`([a-zA-Z.]+)`", row[0])
    assert keys, row
    parent = keys[0].rsplit(".", 1)[0] + "." if "." in keys[0] else ""
    return [keys[0], *(k if "." in k else parent + k for k in keys[1:])]


def _in_schema(schema: dict[str, Any], dotted: str) -> bool:
    node = schema
    for part in dotted.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return False
    return True


def test_the_chart_table_names_only_values_the_chart_has_with_their_defaults() -> None:
    values = yaml.safe_load((ROOT / "charts" / "prefixfleet" / "values.yaml").read_text())
    schema = json.loads((ROOT / "charts" / "prefixfleet" / "values.schema.json").read_text())
    text = (ROOT / "docs" / "operator.md").read_text()
    (rows,) = [r for h, r in tables(text) if "Helm chart" in h and r[0][0] == "Value"]
    problems = []
    for row in rows[2:]:
        full = _row_keys(row)
        defaults = [d.strip() for d in row[1].split(" / ")]
        for i, key in enumerate(full):
            there, value = _values_key(values, key)
            if not there:
                problems.append(f"{key}: not in values.yaml")
                continue
            if not _in_schema(schema, key):
                problems.append(f"{key}: not in values.schema.json")
            documented = literal(defaults[i]) if len(defaults) == len(full) else None
            scalar = isinstance(value, bool | int | float | str) and value != ""
            if (
                scalar
                and documented is not None
                and not (same(documented, value) or documented == str(value).lower())
            ):
                problems.append(f"{key}: documented {defaults[i]}, values.yaml has {value!r}")
    assert not problems, problems


def test_the_load_push_gap_quoted_in_prose_is_the_sidecars() -> None:
    ms = f"{SidecarConfig.__dataclass_fields__['push_min_interval_s'].default * 1000:g} ms"
    quoted = {
        "docs/gateway.md": "pushed as they happen (≥ {} apart)",
        "docs/redis.md": "to one message per {})",
        "docs/local-fleet.md": "Records are pushed at most every {} and",
    }
    for doc, sentence in quoted.items():
        text = " ".join((ROOT / doc).read_text().split())
        assert sentence.format(ms) in text, f"{doc}: should say {sentence.format(ms)!r}"


def test_what_the_docs_say_of_the_example_fleets_autoscaling_is_the_examples() -> None:
    # a `kubectl scale` outside minReplicas..maxReplicas would be undone at once: a newcomer's first
    # command must show a size the example keeps planning from
    spec = yaml.safe_load((ROOT / "examples" / "emulator-fleet.yaml").read_text())["spec"]
    bounds = spec["autoscaling"]
    assert bounds["enabled"]
    text = " ".join((ROOT / "docs" / "operator.md").read_text().split())
    assert f"`spec.autoscaling.enabled` ({bounds['minReplicas']}–{bounds['maxReplicas']} replicas)" in text
    notes = ROOT / "charts" / "prefixfleet" / "templates" / "NOTES.txt"
    scales = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), notes]:
        scales += re.findall(r"kubectl scale pcf/emulator-fleet --replicas=(\d+)", path.read_text())
    assert scales
    assert all(bounds["minReplicas"] <= int(n) <= bounds["maxReplicas"] for n in scales), scales


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def test_the_simulators_documented_json_fields_are_what_sim_writes(tmp_path: Path) -> None:
    from prefixfleet.cli import main

    out = tmp_path / "sim.json"
    argv = ["sim", "--workload", "prefixroute", "--set", "num_requests=30", "--policies", "round_robin"]
    assert main([*argv, "--no-progress", "--json", str(out)]) == 0
    policies = json.loads(out.read_text())["policies"]
    text = (ROOT / "docs" / "simulator.md").read_text()
    # the field list: backticked snake_case names of the Metrics section, up to the `ideal` paragraph
    listed = set(re.findall(r"`([a-z0-9_]+)`", _between(text, "## Metrics (per policy", "**`ideal`**")))
    assert set(policies["round_robin"]) == listed - {"prefill_tokens + cached_tokens == prompt_tokens"}
    ideal = _between(text, "**`ideal`**", "\n\n")
    if "same fields but " in ideal:
        lacks = set(re.findall(r"`([a-z0-9_]+)`", ideal.split("same fields but ", 1)[1].split(")")[0]))
    else:
        lacks = set()
    assert set(policies["ideal"]) == set(policies["round_robin"]) - lacks


def test_the_chart_table_names_every_value() -> None:
    # every top-level value and every key of a top-level object (operator.*, redis.*, podMonitor.*...)
    values = yaml.safe_load((ROOT / "charts" / "prefixfleet" / "values.yaml").read_text())
    text = (ROOT / "docs" / "operator.md").read_text()
    (rows,) = [r for h, r in tables(text) if "Helm chart" in h and r[0][0] == "Value"]
    named = {key for row in rows[2:] for key in _row_keys(row)}
    wanted = {f"{k}.{c}" for k, v in values.items() if isinstance(v, dict) for c in v}
    wanted |= {k for k, v in values.items() if not isinstance(v, dict)}
    missing = [k for k in sorted(wanted) if k not in named and not any(n.startswith(k + ".") for n in named)]
    assert missing == [], f"docs/operator.md's chart table has no row for {missing}"


def test_the_kubectl_get_pcf_header_shown_is_the_crds_printer_columns() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "prefixcachefleets.prefixfleet.io.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")]
    header = "# " + "   ".join(["NAME", *columns])
    shown = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "operator.md"):
        shown += [line.strip() for line in doc.read_text().splitlines() if line.strip().startswith("# NAME ")]
    assert shown
    assert [" ".join(s.split()) for s in shown] == [" ".join(header.split())] * len(shown)
