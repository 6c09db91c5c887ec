"""The one error a malformed manifest raises."""

from __future__ import annotations

from pathlib import Path


class ManifestError(Exception):
    """A manifest that is malformed: names the file, the entry and the field.

    ``str(err)`` reads ``"<file>: <entry>: <field>: <problem>"``; the parts are also kept
    as attributes so tests and tools need not parse the text.
    """

    def __init__(self, path: str | Path, entry: str | None, field: str | None, problem: str):
        self.path = str(path)
        self.entry = entry
        self.field = field
        self.problem = problem
        where = [self.path]
        if entry is not None:
            where.append(entry)
        if field is not None:
            where.append(field)
        super().__init__(": ".join(where) + ": " + problem)
