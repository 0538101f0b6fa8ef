"""A signature the docs show is the function's own.

docs/simulator.md showed ``build_workload(spec, *, seed=0, **settings)`` after the spec became
positional-only (``spec, /``: a setting may be named 'spec' without colliding with it). Every
backticked ``name(parameters)`` in docs/ and the README that names a public function of the
workload modules and shows a signature (a default, ``*`` or ``/``) is compared with
:func:`inspect.signature`, annotations left out; the ``**`` parameter may have the docs' own name
(the docs call a workload's keyword arguments its settings).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from prefixfleet.fleet import sampling
from prefixfleet.sim import scenarios, workloads

REPO = Path(__file__).resolve().parents[1]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
MODULES: tuple[ModuleType, ...] = (workloads, scenarios, sampling)
SHOWN = re.compile(r"`(\w+)\(([^`()]*)\)")


def public_functions(modules: tuple[ModuleType, ...]) -> dict[str, Callable[..., Any]]:
    return {
        name: obj
        for module in modules
        for name, obj in vars(module).items()
        if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("_")
    }


def bare_signature(function: Callable[..., Any]) -> str:
    """``function``'s parameters as the docs write them: no annotations, ``**`` without its name."""
    parts: list[str] = []
    kinds = inspect.Parameter
    params = list(inspect.signature(function).parameters.values())
    for i, p in enumerate(params):
        # a bare '*' before the first keyword-only parameter, unless '*args' already marks it
        before = params[i - 1].kind if i else None
        if p.kind is kinds.KEYWORD_ONLY and before not in (kinds.KEYWORD_ONLY, kinds.VAR_POSITIONAL):
            parts.append("*")
        if p.kind is kinds.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
        elif p.kind is kinds.VAR_KEYWORD:
            parts.append("**")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
        last_positional_only = p.kind is kinds.POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind is not kinds.POSITIONAL_ONLY
        )
        if last_positional_only:
            parts.append("/")
    return ", ".join(parts)


def documented_signatures() -> list[tuple[str, str, str]]:
    """(doc, function name, parameters as shown) of every signature the docs show."""
    functions = public_functions(MODULES)
    found = []
    for doc in DOCS:
        for match in SHOWN.finditer(doc.read_text()):
            name, shown = match.groups()
            if name in functions and re.search(r"=|\*|(^|, )/(,|$)", shown):
                found.append((doc.relative_to(REPO).as_posix(), name, shown))
    return found


def test_the_renderer_writes_markers_and_defaults() -> None:
    def example(a: int, b: str = "x", /, c: float = 1.0, *, d: int = 0, **kw: Any) -> None: ...

    assert bare_signature(example) == "a, b='x', /, c=1.0, *, d=0, **"

    def with_args(a: int, *args: int, d: int = 0, **kw: Any) -> None: ...

    assert bare_signature(with_args) == "a, *args, d=0, **"  # no '*' after '*args' (was 'a, *args, *, d=0')
    assert bare_signature(workloads.build_workload) == "spec, /, *, seed=0, **"


def test_the_docs_show_a_signature_of_a_workload_function() -> None:
    assert ("docs/simulator.md", "build_workload") in {
        (doc, name) for doc, name, _ in documented_signatures()
    }


@pytest.mark.parametrize(("doc", "name", "shown"), documented_signatures())
def test_a_documented_signature_is_the_functions(doc: str, name: str, shown: str) -> None:
    expected = bare_signature(public_functions(MODULES)[name])
    assert re.sub(r"\*\*\w+", "**", shown) == expected, f"{doc}: `{name}({shown})`"
