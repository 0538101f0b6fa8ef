"""The ``prefixfleet bench`` command group.

``bench`` is registered once, here; each benchmark module listed in :data:`BENCH_MODULES` adds its own
sub-subcommand through ``add_bench(bench_subparsers)``. To add a benchmark, write a module with that
function and append its import name below.
"""

from __future__ import annotations

import argparse
import importlib

BENCH_MODULES: tuple[str, ...] = ("prefixfleet.benchmarks.tree", "prefixfleet.benchmarks.policies")


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``bench`` to the top-level CLI and return its subparsers (one per benchmark)."""
    bench = subparsers.add_parser("bench", help="benchmarks that print a table and write JSON")
    bench_subparsers = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).add_bench(bench_subparsers)
    return bench_subparsers
