"""Op manifests: the signature, rules, roofline and workloads of every op, from YAML.

The YAML files beside this module are the single source of truth for what an op accepts
(see docs/manifest-format.md). Importing this module reads nothing; the files are read,
checked and compiled once, on the first ``entry()`` or ``all_entries()`` call.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable
from pathlib import Path

from ._entry import InputDecl, MetaSpec, OpEntry, OutputDecl, ParamDecl, WorkloadCase
from ._errors import ManifestError
from ._upstream import Upstream

__all__ = [
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
    "manifest_dir",
]

_DIR = Path(__file__).resolve().parent
_entries: dict[str, OpEntry] | None = None
_lock = threading.Lock()


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


def _all() -> dict[str, OpEntry]:
    global _entries
    entries = _entries
    if entries is None:
        with _lock:  # several threads may make the first call at once
            if _entries is None:
                _entries = _load_from([_DIR])
            entries = _entries
    return entries


def all_entries() -> dict[str, OpEntry]:
    """Every entry of every shipped manifest, by op name (a fresh dict each call)."""
    return dict(_all())


def entry(op_name: str) -> OpEntry:
    """The manifest entry of ``op_name``; ``UnknownOpError`` naming the known ops if none."""
    entries = _all()
    try:
        return entries[op_name]
    except KeyError:
        close = difflib.get_close_matches(str(op_name), entries, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownOpError(
            f"no manifest entry for {op_name!r}{hint}; known ops: {sorted(entries)}"
        ) from None
