"""`prefixfleet operator ...`: the control-plane commands.

``operator crd`` prints (or writes) the generated CustomResourceDefinition. Other operator
subcommands (``operator run`` — the kopf handlers) live in their own modules, listed in
:data:`SUBCOMMAND_MODULES`; each exposes ``register(operator_subparsers)`` and is skipped while
it does not exist yet.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

from prefixfleet.cli import UsageError

from .crd import build_crd, render_crd_yaml, render_field_reference
from .crd_admission import apply_defaults, cel_errors, crd_schema, schema_errors, unknown_fields
from .models import KIND, InvalidFleetSpec, validate_spec

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

    validate = sub.add_parser(
        "validate",
        help="check PrefixCacheFleet YAML files offline, as the API server and the operator would",
        description="Check PrefixCacheFleet manifests offline: unknown fields, the CRD schema, its CEL rules "
        "(with cel-python installed) and the operator's own models. Exit 1 when any is invalid.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="YAML files ('-' for stdin)")
    validate.set_defaults(func=run_validate)

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


def _documents(name: str) -> list[Any]:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise UsageError(f"{name} is not valid YAML: {exc}") from None


def problems_of(obj: dict[str, Any], crd: dict[str, Any], with_cel: bool) -> list[str]:
    """Every reason the API server or the operator would refuse this PrefixCacheFleet."""
    schema = crd_schema(crd)
    found = unknown_fields(schema, obj)
    defaulted = apply_defaults(schema, obj)
    found += schema_errors(schema, defaulted)
    if with_cel and not found:
        found += cel_errors(schema, defaulted)
    # The models repeat the schema's checks in other words; they add what only Python can check.
    if not found and isinstance(obj.get("spec"), dict):
        try:
            validate_spec(obj["spec"])
        except InvalidFleetSpec as exc:
            found += exc.problems
    return list(dict.fromkeys(found))


def run_validate(args: argparse.Namespace) -> int:
    crd = build_crd()
    with_cel = importlib.util.find_spec("celpy") is not None
    if not with_cel:
        print("note: cel-python is not installed; CEL rules are checked by the models only", file=sys.stderr)
    invalid = 0
    for name in args.files:
        for doc in _documents(name):
            if not isinstance(doc, dict) or doc.get("kind") != KIND:
                kind = doc.get("kind", "?") if isinstance(doc, dict) else type(doc).__name__
                print(f"{name}: skipped a {kind} (not a {KIND})")
                continue
            label = f"{name}: {(doc.get('metadata') or {}).get('name', '<unnamed>')}"
            found = problems_of(doc, crd, with_cel)
            invalid += bool(found)
            print(f"{label}: ok" if not found else "\n".join(f"{label}: {p}" for p in found))
    return 1 if invalid else 0
