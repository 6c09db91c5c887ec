"""The reliability suite's view of tests/_fake_backends.py: a folder of backend packages
(``Packages.add``) and fresh interpreters that discover only them (``run_fresh``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _fake_backends import PackageDir, explain, run_script

__all__ = ["Packages", "explain", "run_fresh"]


class Packages(PackageDir):
    """A folder of installed backend distributions."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, f"{root.name}.events")

    def add(
        self, module: str, body: str, *, entry_point: str | None = None, dist: str | None = None
    ) -> None:
        """Install distribution ``dist`` (default ``<module>-dist``) whose entry point
        ``entry_point`` (default: the module's name) names module ``module``."""
        self.write_module(module, body)
        self.write_dist(dist or f"{module}-dist", {entry_point or module: module})


def run_fresh(
    code: str, packages: Packages, *, flags: tuple[str, ...] = (), timeout: float = 90
) -> dict[str, Any]:
    """Runs ``code`` in a new interpreter that sees only ``packages``; see ``run_script``."""
    return run_script(code, packages, flags=flags, timeout=timeout)
