"""`prefixfleet operator ...`: the control-plane commands.

``operator crd`` prints (or writes) the generated CustomResourceDefinition. Other operator
subcommands (``operator run`` — the kopf handlers) live in their own modules, listed in
:data:`SUBCOMMAND_MODULES`; each exposes ``register(operator_subparsers)`` and is skipped while
it does not exist yet.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from prefixfleet.cli import UsageError

from .crd import render_crd_yaml, render_field_reference

SUBCOMMAND_MODULES: tuple[str, ...] = ("prefixfleet.operator.run",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="control plane: CRD generation and the Kubernetes operator",
        description="The PrefixCacheFleet control plane.",
    )
    sub = parser.add_subparsers(dest="operator_command", metavar="SUBCOMMAND", required=True)

    crd = sub.add_parser(
        "crd",
        help="print the PrefixCacheFleet CRD generated from the models",
        description="Print the PrefixCacheFleet CustomResourceDefinition (YAML) generated from the models.",
    )
    crd.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    crd.add_argument(
        "--markdown", action="store_true", help="print the field reference (Markdown table) instead of YAML"
    )
    crd.set_defaults(func=run_crd)

    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of the operator is not built yet
            raise
        module.register(sub)


def run_crd(args: argparse.Namespace) -> int:
    text = render_field_reference() if args.markdown else render_crd_yaml()
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if not path.parent.is_dir():
        raise UsageError(f"--output: directory {str(path.parent)!r} does not exist")
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0
