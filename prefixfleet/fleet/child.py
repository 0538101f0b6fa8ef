"""Entry point for the fleet's child processes: ``python -m prefixfleet.fleet.child emulator ...``.

Same arguments and behaviour as ``prefixfleet emulator|router ...``, but only the one command module
is imported: the full dispatcher imports every part of the product (operator, simulator, ...), which
costs each of a fleet's many children about half a second of CPU at start-up.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from prefixfleet.cli import UsageError, build_parser

COMMANDS = ("emulator", "router")  # each in prefixfleet.cli.COMMAND_OWNERS: only its module is imported


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m prefixfleet.fleet.child {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    # the CLI's own parser for just this command (build_parser imports only its module): refusals read
    # `prefixfleet router gateway: error: ...` in one line, as they do under `prefixfleet`
    args = build_parser(only=argv[0]).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{args.command_prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # silent, as before: a child has no terminal of its own to report to
        return 130


if __name__ == "__main__":
    sys.exit(main())
