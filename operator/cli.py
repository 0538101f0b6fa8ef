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
from .models import API_VERSION, GROUP, KIND, InvalidFleetSpec, validate_spec
from .planner import redis_password_warning

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
    try:
        path.write_text(text)
    except OSError as exc:  # a directory of that name, a full disk, a device: one line, not a traceback
        raise UsageError(f"--output: cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _documents(name: str) -> list[tuple[str, Any]]:
    """The file's non-empty documents, each with its place ("document 2"), counted as an editor
    counts ``---`` separators: an empty document keeps its number."""
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:  # kubectl reads manifests as UTF-8 too
        raise UsageError(f"{name} is not UTF-8 text: byte {exc.start}: {exc.reason}") from None
    try:
        return [
            (f"document {number}", doc)
            for number, doc in enumerate(yaml.safe_load_all(text), 1)
            if doc is not None
        ]
    except yaml.YAMLError as exc:
        raise UsageError(f"{name} is not valid YAML: {_yaml_error_line(exc)}") from None


def _listed(where: str, doc: Any) -> list[tuple[str, Any]]:
    """The objects a document stands for, as ``kubectl apply`` reads it: the items of a list (an
    object with an ``items`` list, such as ``kind: List`` from ``kubectl get -o yaml``), flattened,
    or the document itself; each with its place ("document 1, item 2")."""
    if isinstance(doc, dict) and isinstance(doc.get("items"), list):
        return [
            listed
            for index, item in enumerate(doc["items"], 1)
            for listed in _listed(f"{where}, item {index}", item)
        ]
    return [(where, doc)]


# What a YAML value that is no Kubernetes object is, in words (not Python's type names: "a int").
_NOT_AN_OBJECT = {
    bool: "true or false",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
    type(None): "null",
}


def skipped_line(where: str, doc: Any) -> str:
    """Why validate passes over ``doc`` (at ``where``) that is no PrefixCacheFleet: another kind of
    object is named by its kind; anything else by its place, since it has no name to find it by."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(kind, str) and kind:
        article = "an" if kind[0].lower() in "aeiou" else "a"
        return f"skipped {article} {kind} (not a {KIND})"
    if isinstance(doc, dict):
        what = "an object with no kind" if kind in (None, "") else f"an object whose kind is {kind!r}"
    else:
        what = _NOT_AN_OBJECT.get(type(doc), f"a {type(doc).__name__}")  # a YAML date, say
    return f"skipped {where}: {what}, not a Kubernetes object"


def _yaml_error_line(exc: yaml.YAMLError) -> str:
    """PyYAML's message spans several lines (with a caret drawing); the error is one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(exc).split())


def identity_problems(doc: dict[str, Any]) -> list[str] | None:
    """None for another group's object (skipped); else why the API server would not take this one
    as a PrefixCacheFleet at all (a misspelt kind of our group, an apiVersion the CRD does not serve),
    which the schema cannot say: it reads only what is under the kind's own fields."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    group = api_version.partition("/")[0] if isinstance(api_version, str) and "/" in api_version else None
    if kind != KIND and group != GROUP:
        return None
    found = []
    if kind != KIND:
        found.append(f"kind: {kind!r} is not a kind of {GROUP} (its one kind is {KIND})")
    if api_version != API_VERSION:
        found.append(f"apiVersion: {api_version!r} is not served by the {KIND} CRD (use {API_VERSION})")
    return found


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


def warnings_of(obj: dict[str, Any]) -> list[str]:
    """What the operator would warn about in this fleet (a Redis password in spec.redis.url); the
    operator's default URL is unknown here, so only the spec's own is judged."""
    spec = obj.get("spec")
    redis = spec.get("redis") if isinstance(spec, dict) else None
    if not isinstance(redis, dict):
        return []
    warning = redis_password_warning(redis, default_url="")
    return [warning] if warning else []


def run_validate(args: argparse.Namespace) -> int:
    crd = build_crd()
    with_cel = importlib.util.find_spec("celpy") is not None
    if not with_cel:
        print("note: cel-python is not installed; CEL rules are checked by the models only", file=sys.stderr)
    invalid = fleets = 0
    for name in args.files:
        for where, doc in (obj for document in _documents(name) for obj in _listed(*document)):
            found = identity_problems(doc) if isinstance(doc, dict) else None
            if found is None:
                print(f"{name}: {skipped_line(where, doc)}")
                continue
            fleets += 1
            metadata = doc.get("metadata")
            # (a string or a list in a hand-written manifest: the schema's error says so below)
            named = metadata.get("name", "<unnamed>") if isinstance(metadata, dict) else "<unnamed>"
            label = f"{name}: {named}"
            if doc.get("kind") == KIND:
                found += problems_of(doc, crd, with_cel)
            invalid += bool(found)
            print(f"{label}: ok" if not found else "\n".join(f"{label}: {p}" for p in found))
            # said, not refused (the exit status stays): the API server and the operator accept it
            for warning in warnings_of(doc):
                print(f"{label}: warning: {warning}")
    if not fleets:
        # an empty file or a wrong path's other manifests would otherwise pass a CI check unread
        raise UsageError(f"no {KIND} in {', '.join(args.files)}")
    return 1 if invalid else 0
