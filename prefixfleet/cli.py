"""The `prefixfleet` command line.

Each subcommand lives next to the code it drives and exposes ``register(subparsers)``; this module
only assembles them and turns :class:`UsageError` into a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that contribute subcommands, imported lazily so a missing optional part never breaks the rest.
COMMAND_MODULES: tuple[str, ...] = (
    "prefixfleet.sim.cli",
    "prefixfleet.benchmarks.tree",
    "prefixfleet.emulator.cli",
    "prefixfleet.router.cli",
    "prefixfleet.fleet.cli",
    "prefixfleet.operator.cli",
)


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefixfleet",
        description="Prefix-cache-aware routing and autoscaling for LLM fleets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # this part of the product is not built yet / not installed
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except UsageError as exc:
        print(f"prefixfleet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"prefixfleet {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    # Under `python -m prefixfleet.cli` this file is `__main__`; subcommands raise the UsageError of
    # the importable `prefixfleet.cli`, so dispatch through that module for the one-line error path.
    from prefixfleet.cli import main as _main

    sys.exit(_main())
