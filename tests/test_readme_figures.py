"""The README's live-fleet tables are the committed runs they cite.

`prefixfleet up --policies all` and `prefixfleet compare` are too slow for the suite, so the README
quotes runs whose JSON is committed in docs/local-fleet/. A table re-typed by hand, or a JSON
replaced by a newer run without updating the README, must fail here: these are the first numbers
a newcomer compares their own run with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _table(header: str) -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index(header)
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _shown(row: list[str]) -> list[float]:
    """mean, p50, p99 (ms), hit rate (%), errors as numbers."""
    return [float(re.sub(r"[^0-9.]", "", cell)) for cell in row[1:6]]


def _expected(mean: float, p50: float, p99: float, hit: float, errors: int) -> list[float]:
    return [round(mean, 1), round(p50, 1), round(p99, 1), round(hit * 100, 1), errors]


def test_the_up_all_table_is_docs_local_fleet_up_all_json() -> None:
    policies: dict[str, Any] = json.loads((ROOT / "docs" / "local-fleet" / "up-all.json").read_text())[
        "policies"
    ]
    rows = _table("| policy | mean ms | p50 ms | p99 ms | hit rate | errors |")
    assert {r[0].split()[0] for r in rows} == set(policies)
    for row in rows:
        p = policies[row[0].split()[0]]
        want = _expected(p["mean_ttft_ms"], p["p50_ttft_ms"], p["p99_ttft_ms"], p["hit_rate"], p["errors"])
        assert _shown(row) == want, row


def test_the_compare_table_is_docs_local_fleet_compare_json() -> None:
    data = json.loads((ROOT / "docs" / "local-fleet" / "compare.json").read_text())
    names = {
        "prefixfleet": "prefixfleet",
        "sglang-router": "sglang_cache_aware",
        "round_robin": "round_robin",
    }
    rows = _table("| router | mean ms | p50 ms | p99 ms | hit rate | errors |")
    assert len(rows) == len(names)
    for row in rows:
        key = names[row[0].split()[0]]
        r, p50 = data["routers"][key], data["details"][key]["p50_ttft_ms"]
        assert _shown(row) == _expected(
            r["mean_ttft_ms"], p50, r["p99_ttft_ms"], r["hit_rate"], r["errors"]
        ), row
    added = data["added_latency_ms"]
    assert f"**+{added['p50']:.2f} ms p50** (+{added['p99']:.1f} ms p99)" in (ROOT / "README.md").read_text()
