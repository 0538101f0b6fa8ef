"""Files a command writes when it is done (``--json``, ``--plot``, ``--out``, ``--run-dir``).

They are checked before the run, so a path that cannot be written costs a one-line error instead of
a finished run's results; and written afterwards through :func:`writing`, so a failure that only
shows at write time (a full disk, a read-only mount) is one line too, never a traceback. Missing
parent directories are created, as ``mkdir -p`` would.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefixfleet.cli import UsageError


def output_file(
    value: str | Path | None, flag: str, *, suffix: str | None = None, inputs: Iterable[str | Path] = ()
) -> Path | None:
    """``value`` as a file this process can create or overwrite (``suffix``: its required extension).

    None (the flag was not given) stays None; anything else that cannot be written is a
    :class:`UsageError` naming ``flag``, and so is one of ``inputs`` (files the command reads, e.g.
    its trace: ``--json trace.jsonl`` would replace the trace with the results).
    """
    if value is None:
        return None
    path = _non_empty(value, flag)
    for source in inputs:
        if path.exists() and Path(source).exists() and os.path.samefile(path, source):
            raise UsageError(f"{flag} {path} is the input {source}; writing there would replace it")
    if suffix is not None and path.suffix.lower() != suffix:
        # matplotlib picks the format from the extension: '.txt' fails after the run, no extension
        # silently writes FILE.png instead of FILE
        raise UsageError(f"{flag} must name a {suffix} file, got {str(value)!r}")
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable")
    _check_creatable(path.parent, flag)
    return path


def output_dir(value: str | Path | None, flag: str) -> Path | None:
    """``value`` as a directory that exists or can be created, writable; None stays None."""
    if value is None:
        return None
    path = _non_empty(value, flag)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is not a directory")
    _check_creatable(path, flag)
    return path


def distinct_outputs(files: Mapping[str, Path | None], directories: Mapping[str, Path | None]) -> None:
    """The files and directories a command writes (``{flag: path}``; None: not given) are different
    paths, and no file is where another output goes in. The same file for ``--json`` and ``--plot``
    kept only the plot, written over the results; a ``--json`` naming the ``--run-dir`` (or a
    directory above it) was refused only after the run, once the run had made that directory."""
    seen: dict[Path, str] = {}
    for flag, path in [*files.items(), *directories.items()]:
        if path is None:
            continue
        where = path.resolve()  # 'out/x.png' and './out/../out/x.png', or a symlink to it, are one file
        if where in seen:
            raise UsageError(f"{seen[where]} and {flag} both name {path}; give each its own path")
        seen[where] = flag
    file_flags = {where: flag for where, flag in seen.items() if flag in files}
    for where, flag in seen.items():
        above = next((file_flags[p] for p in where.parents if p in file_flags), None)
        if above is not None:
            raise UsageError(f"{flag} {where} is inside the file {above} names; give {above} another path")


@contextmanager
def writing(path: Path, flag: str) -> Iterator[Path]:
    """Create ``path``'s directory, then run the body; an OSError in either is a one-line error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield path
    except OSError as exc:  # name the file that failed: a body may write more than ``path``
        raise UsageError(f"cannot write {flag} {exc.filename or path}: {exc.strerror or exc}") from None


def write_json(path: Path, data: Any, flag: str = "--json") -> None:
    """``data`` as indented JSON in ``path`` (checked earlier with :func:`output_file`).

    A float that is not finite (the mean TTFT of a run where nothing succeeded is nan) is written as
    null: ``NaN`` is no JSON, and jq, browsers and strict parsers refuse the whole file."""
    text = json.dumps(finite_json(data), indent=2, allow_nan=False)
    with writing(path, flag):
        path.write_text(text + "\n", encoding="utf-8")


def finite_json(value: Any) -> Any:
    """``value`` with every nan/inf float, at any depth of dicts, lists and tuples, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def _non_empty(value: str | Path, flag: str) -> Path:
    if not str(value).strip():
        raise UsageError(f"{flag} is empty; give a path")
    return Path(value)


def _check_creatable(directory: Path, flag: str) -> None:
    """``directory`` exists or ``mkdir -p`` can make it: its nearest existing ancestor is a writable dir."""
    for ancestor in (directory, *directory.parents):
        if not ancestor.exists():
            continue
        if not ancestor.is_dir():
            raise UsageError(f"{flag}: {ancestor} is not a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise UsageError(f"{flag}: cannot create files in {ancestor} (permission denied)")
        return
