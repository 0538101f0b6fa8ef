"""The `prefixfleet` command line.

Each subcommand lives next to the code it drives and exposes ``register(subparsers)``; this module
only assembles them and turns :class:`UsageError` into a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import math
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

# Modules that contribute subcommands, imported lazily so a missing optional part never breaks the rest.
COMMAND_MODULES: tuple[str, ...] = (
    "prefixfleet.sim.cli",
    "prefixfleet.sim.autoscale_cli",
    "prefixfleet.benchmarks.tree",
    "prefixfleet.emulator.cli",
    "prefixfleet.router.cli",
    "prefixfleet.fleet.cli",
    "prefixfleet.operator.cli",
    "prefixfleet.observability.report",
    "prefixfleet.chaos.cli",
)


# Which module owns a command, so running one command imports only its module (the others pull in
# kopf, aiohttp, matplotlib...: seconds of start-up for every process the local fleet launches).
# A command missing here still works: the parser falls back to importing every module.
COMMAND_OWNERS: dict[str, str] = {
    "sim": "prefixfleet.sim.cli",
    "sim-autoscale": "prefixfleet.sim.autoscale_cli",
    "bench": "prefixfleet.benchmarks.tree",
    "emulator": "prefixfleet.emulator.cli",
    "emulator-bench": "prefixfleet.emulator.cli",
    "router": "prefixfleet.router.cli",
    "up": "prefixfleet.fleet.cli",
    "load": "prefixfleet.fleet.cli",
    "compare": "prefixfleet.fleet.cli",
    "operator": "prefixfleet.operator.cli",
    "report": "prefixfleet.observability.report",
    "chaos": "prefixfleet.chaos.cli",
}


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


def counted(n: int, noun: str) -> str:
    """``1 gateway``, ``2 gateways``: a fleet of one is a common first run, and "1 engines" in a
    title reads as a bug. ``noun`` is the singular; every noun counted in the CLI takes an s."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def check_positive(
    flag: str, value: float | None, *, allow_zero: bool = False, allow_none: bool = False
) -> None:
    """A flag's number must be finite and > 0 (>= 0 with ``allow_zero``): ``value <= 0`` alone lets
    NaN and infinity through, and a NaN interval or rate poisons every comparison made with it."""
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        shown = "nothing" if value is None else f"{value:g}"
        raise UsageError(f"{flag} must be {'>= 0' if allow_zero else 'positive'}, got {shown}")


def listen_error(
    host: str, port: int, exc: OSError, *, host_flag: str = "--host", port_flag: str = "--port"
) -> str | None:
    """One line naming the flag behind a failed bind (the event loop's own text is "[Errno 98] error
    while attempting to bind on address ('127.0.0.1', 8080): ..."); None for an OSError that is no
    bind failure (a service's run can raise others), which the caller words itself."""
    where = "every interface" if not host else f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not host:
        where += f", port {port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{port_flag} {port}: address {where} is already in use"
    if exc.errno == errno.EACCES:
        return f"{port_flag} {port}: permission denied to listen on {where} (ports below 1024 need root)"
    if exc.errno == errno.EADDRNOTAVAIL or (exc.errno is not None and exc.errno < 0):  # < 0: getaddrinfo
        # os.strerror: uvloop's strerror repeats the whole "error while attempting to bind ..." text
        reason = os.strerror(exc.errno) if exc.errno > 0 else exc.strerror or str(exc)
        return f"{host_flag} {host!r}: cannot listen on {where}: {reason}"
    return None


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless there is none to show (None, an empty list or string, a required flag)
    or its help already says what the default is: no "(default: None)" after "default: the
    workload's"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        says_default = "default:" in help_text or "(default" in help_text  # not 'default' as a value
        if action.default in (None, [], "") or action.required or says_default:
            return action.help
        return super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's own refusals (a value outside its choices, an unknown or missing flag) as the one
    line every other bad input gets, without the usage block before it (``--help`` shows that).
    Subcommand parsers are built from the same class (``add_subparsers`` uses the parent's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{self._commands_hint(message)}\n")

    def _commands_hint(self, message: str) -> str:
        """For a missing subcommand (bare ``prefixfleet``, ``prefixfleet operator``), which ones there
        are: the usage block that listed them is gone, and "required: COMMAND" alone leaves a
        newcomer guessing."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.choices:
                name = argparse._get_action_name(action)
                if message == f"the following arguments are required: {name}":
                    return f" (one of {', '.join(action.choices)}; '{self.prog} --help' says what each does)"
        return ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (``only``: a command name) one holding just the module that owns it."""
    parser = OneLineErrorParser(
        prog="prefixfleet",
        description="Prefix-cache-aware routing and autoscaling for LLM fleets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [COMMAND_OWNERS[only]] if only in COMMAND_OWNERS else COMMAND_MODULES
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # this part of the product is not built yet / not installed
            raise
        module.register(sub)
    _name_leaves(parser)
    return parser


def _name_leaves(parser: argparse.ArgumentParser) -> None:
    """Each runnable subcommand records its full name (``prefixfleet router gateway``), so the
    command's own refusals name it as argparse's refusals do."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.set_defaults(command_prog=parser.prog)
    for action in subs:
        for child in action.choices.values():
            _name_leaves(child)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = f"prefixfleet {argv[0]}" if argv and argv[0] in COMMAND_OWNERS else "prefixfleet"
    try:
        # Building the parser imports the command's module (numpy, aiohttp, the simulator...): seconds
        # on a busy machine, long enough for a Ctrl-C that would otherwise print an import traceback.
        parser = build_parser(only=argv[0] if argv else None)
        args = parser.parse_args(argv)
        name = getattr(args, "command_prog", f"prefixfleet {args.command}")
        result = args.func(args)
    except UsageError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    # Under `python -m prefixfleet.cli` this file is `__main__`; subcommands raise the UsageError of
    # the importable `prefixfleet.cli`, so dispatch through that module for the one-line error path.
    from prefixfleet.cli import main as _main

    sys.exit(_main())
