"""What the manifests declare, read without parsing them: each op's name, file and modules.

``import tileops.ops`` needs only this much (which names exist, at which modules), and a
full parse of every manifest (YAML, expression compilation, workload checks) costs far
more than a process should pay before it touches an op. So each file is first scanned as
text for its top-level names and their ``module:`` lines, in the plain form every shipped
manifest uses::

    RMSNormFwdOp:
      module: tileops.ops.norm.rms_norm       # or [a.b, a.c]

A file written any other way (a name in quotes, ``module:`` as a block list or through a
merge key, a document marker, ...) is not guessed at: the scan gives up on it and the
caller parses that file in full. Whenever a file is parsed, the caller checks that the
parse agrees with its scan (``check_against``), so the two readings cannot drift apart.

Standard library only: nothing here may import torch-heavy modules or yaml.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ._errors import ManifestError

#: The package that op classes live under; ``module:`` names a path below it.
OPS_PACKAGE = "tileops.ops"

_TOP_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):[ \t]*(?:#.*)?")
_MODULE = re.compile(r"module:[ \t]+(?P<value>[^#]*?)[ \t]*(?:#.*)?")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


class Declared(NamedTuple):
    """One manifest entry as the index knows it."""

    name: str
    source: Path
    modules: tuple[str, ...]  # modules[0] defines the class; the rest re-export it


def is_module_path(path: object) -> bool:
    """Whether ``path`` is a dotted module path under tileops.ops that ``module:`` may name."""
    if not isinstance(path, str) or not path.startswith(OPS_PACKAGE + "."):
        return False
    parts = path.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts) and not any(
        p.startswith("_") for p in parts
    )


def _module_value(text: str) -> tuple[str, ...] | None:
    """``module:``'s value when written as one plain path or a one-line flow list of them."""
    if text.startswith("[") and text.endswith("]"):
        items = [item.strip() for item in text[1:-1].split(",")]
    else:
        items = [text]
    if not items or not all(_DOTTED.fullmatch(item) for item in items):
        return None
    if len(set(items)) != len(items) or not all(is_module_path(item) for item in items):
        return None  # the parse reports it, with the manifest's own words
    return tuple(items)


def scan(path: Path) -> list[Declared] | None:
    """The entries of one manifest file in the order written, or None where the file is
    not in the plain form this scan reads (the caller then parses it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the parse reports it
    found: list[tuple[str, tuple[str, ...] | None]] = []
    child_indent: int | None = None
    for line in text.splitlines():
        content = line.lstrip(" ")
        if not content or content.startswith("#"):
            continue
        indent = len(line) - len(content)
        if indent == 0:
            top = _TOP_KEY.fullmatch(line)
            if top is None:
                return None  # a document marker, a flow entry, an anchor, a quoted name ...
            found.append((top.group(1), None))
            child_indent = None
            continue
        if not found or content.startswith("\t"):
            return None
        if child_indent is None:
            child_indent = indent  # the entry's keys sit at its first indented line's column
        if indent < child_indent:
            return None
        if indent == child_indent and content.startswith("module:"):
            name, modules = found[-1]
            match = _MODULE.fullmatch(content)
            value = None if match is None else _module_value(match.group("value"))
            if modules is not None or value is None:
                return None
            found[-1] = (name, value)
    if not found or any(modules is None for _, modules in found):
        return None
    if len({name for name, _ in found}) != len(found):
        return None  # a name written twice: the parse refuses the file
    return [Declared(name, path, modules) for name, modules in found if modules is not None]


def merge(files: Iterable[list[Declared]]) -> dict[str, Declared]:
    """Every file's entries by name, in file order; an op declared in two files is an error."""
    index: dict[str, Declared] = {}
    for declared in files:
        for item in declared:
            earlier = index.get(item.name)
            if earlier is not None:
                raise ManifestError(item.source, item.name, None, f"op is also declared in {earlier.source}")
            index[item.name] = item
    return index


def check_against(scanned: list[Declared], parsed: dict[str, tuple[str, ...]]) -> None:
    """The parse of a scanned file (op name -> modules) must say what the scan said."""
    said = {item.name: item.modules for item in scanned}
    if list(said.items()) != list(parsed.items()):
        source = scanned[0].source if scanned else "?"
        raise ManifestError(
            source,
            None,
            None,
            f"a text scan of the file read the entries {said} but YAML reads {parsed}; "
            "write each op name at the start of a line and its module: on one line",
        )
