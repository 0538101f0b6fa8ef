"""Entry point for the fleet's child processes: ``python -m prefixfleet.fleet.child emulator ...``.

Same arguments and behaviour as ``prefixfleet emulator|router ...``, but only the one command module
is imported: the full dispatcher imports every part of the product (operator, simulator, ...), which
costs each of a fleet's many children about half a second of CPU at start-up.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from prefixfleet.cli import UsageError

COMMANDS: dict[str, str] = {"emulator": "prefixfleet.emulator.cli", "router": "prefixfleet.router.cli"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m prefixfleet.fleet.child {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="prefixfleet")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    importlib.import_module(COMMANDS[argv[0]]).register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"prefixfleet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
