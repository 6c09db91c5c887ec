"""Op manifests: the signature, rules, roofline and workloads of every op, from YAML.

The YAML files beside this module are the single source of truth for what an op accepts
(see docs/manifest-format.md). Importing this module reads nothing. ``index()`` says which
ops exist and where their classes live from a text scan of the files (``_index``); a file
is parsed, checked and compiled once, on the first ``entry()`` of one of its ops, and
every file on the first ``all_entries()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import _index
from ._errors import ManifestError
from ._index import Declared

if TYPE_CHECKING:  # imported on first use: they import torch's heavier parts
    from ._entry import InputDecl, MetaSpec, OpEntry, OutputDecl, ParamDecl, WorkloadCase
    from ._upstream import Upstream

__all__ = [
    "Declared",
    "InputDecl",
    "ManifestError",
    "MetaSpec",
    "OpEntry",
    "OutputDecl",
    "ParamDecl",
    "UnknownOpError",
    "Upstream",
    "WorkloadCase",
    "all_entries",
    "entry",
    "index",
    "manifest_dir",
]

_LAZY = {
    "InputDecl": "_entry",
    "MetaSpec": "_entry",
    "OpEntry": "_entry",
    "OutputDecl": "_entry",
    "ParamDecl": "_entry",
    "WorkloadCase": "_entry",
    "Upstream": "_upstream",
}

_DIR = Path(__file__).resolve().parent
_index_by_name: Mapping[str, Declared] | None = None
_scanned: dict[Path, list[Declared]] = {}  # files read by the scan, checked on their parse
_by_file: dict[Path, dict[str, OpEntry]] = {}
_entries: dict[str, OpEntry] | None = None  # every entry, once every file is parsed
_lock = threading.RLock()  # several threads may make the first call at once


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class UnknownOpError(KeyError):
    """No manifest declares this op. A KeyError (so a LookupError) with a readable text."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def manifest_dir() -> Path:
    """The folder holding the shipped ``*.yaml`` manifests."""
    return _DIR


def _load_from(paths: Iterable[str | Path]) -> dict[str, OpEntry]:
    """Load the given files or folders, bypassing the cache (for tests and tools)."""
    from ._load import load_paths  # yaml is imported only when something is loaded

    return load_paths(paths)


def index() -> Mapping[str, Declared]:
    """Every shipped op's name, manifest file and modules, in manifest order (files by
    name, entries as written), read without parsing any file that the scan can read."""
    found = _index_by_name
    if found is None:
        with _lock:
            if _index_by_name is None:
                _build_index()
            found = _index_by_name
    assert found is not None
    return found


def _build_index() -> None:
    global _index_by_name
    per_file = []
    for path in sorted(_DIR.glob("*.yaml")):
        scanned = _index.scan(path)
        if scanned is None:  # not in the plain form: the parse says what the file holds
            parsed = _parse(path)
            scanned = [Declared(name, path, e.modules) for name, e in parsed.items()]
        else:
            _scanned[path] = scanned
        per_file.append(scanned)
    _index_by_name = MappingProxyType(_index.merge(per_file))


def _parse(path: Path) -> dict[str, OpEntry]:
    from ._load import load_file

    entries = load_file(path)
    scanned = _scanned.get(path)
    if scanned is not None:  # kept: a parse that fails this check is not cached either
        _index.check_against(scanned, {name: e.modules for name, e in entries.items()})
    _by_file[path] = entries
    return entries


def _file_entries(path: Path) -> dict[str, OpEntry]:
    entries = _by_file.get(path)
    if entries is None:
        with _lock:
            entries = _by_file.get(path)
            if entries is None:
                entries = _parse(path)
    return entries


def _all() -> dict[str, OpEntry]:
    global _entries
    entries = _entries
    if entries is None:
        with _lock:
            if _entries is None:
                _entries = {n: _file_entries(d.source)[n] for n, d in index().items()}
            entries = _entries
    return entries


def all_entries() -> dict[str, OpEntry]:
    """Every entry of every shipped manifest, by op name (a fresh dict each call)."""
    return dict(_all())


def entry(op_name: str) -> OpEntry:
    """The manifest entry of ``op_name``, parsing only the file that declares it;
    ``UnknownOpError`` naming the known ops if none."""
    known = index()
    declared = known.get(op_name) if isinstance(op_name, str) else None
    if declared is None:
        import difflib

        close = difflib.get_close_matches(str(op_name), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownOpError(f"no manifest entry for {op_name!r}{hint}; known ops: {sorted(known)}")
    return _file_entries(declared.source)[op_name]
