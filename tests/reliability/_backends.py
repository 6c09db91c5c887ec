"""Tiny backend packages installed for real, and fresh interpreters to discover them.

A package here is what ``pip install`` leaves behind: a module, plus a ``*.dist-info``
folder whose ``entry_points.txt`` declares the group ``tileops.backends``, in a folder on
``sys.path`` (this process) or ``PYTHONPATH`` (a fresh interpreter). Every module starts by
appending ``imported <module>`` to the folder's event log, so a test can count imports even
across interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

GROUP = "tileops.backends"

_PRELUDE = """\
import os as _os


def log(event):
    with open({log!r}, "a") as _events:
        _events.write(str(event) + "\\n")


log("imported " + __name__)
"""


class Packages:
    """A folder of installed backend distributions."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = root.parent / f"{root.name}.events"

    def add(
        self, module: str, body: str, *, entry_point: str | None = None, dist: str | None = None
    ) -> None:
        """Install distribution ``dist`` (default ``<module>-dist``) whose entry point
        ``entry_point`` (default: the module's name) names module ``module``."""
        source = _PRELUDE.format(log=str(self.log_path)) + "\n" + textwrap.dedent(body)
        (self.root / f"{module}.py").write_text(source)
        dist = dist or f"{module}-dist"
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entry_point or module} = {module}\n")

    def events(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def imports_of(self, module: str) -> int:
        return self.events().count(f"imported {module}")

    def owns(self, entry_point: Any) -> bool:
        dist = getattr(entry_point, "dist", None)
        if dist is None:
            return False
        return Path(dist.locate_file("")).resolve() == self.root.resolve()


# A fresh interpreter discovers only the packages of its folder (the environment may hold
# real backends too, e.g. the sanitizer job's): discovery's listing is filtered before
# anything reads the registry, so discovery still happens for the first time in the script.
_ONLY_THESE_PACKAGES = """\
import pathlib as _pathlib
import tileops.backend.discovery as _discovery

_root = _pathlib.Path({root!r}).resolve()
_listed = _discovery._entry_points
_discovery._entry_points = lambda: [
    ep for ep in _listed()
    if getattr(ep, "dist", None) is not None
    and _pathlib.Path(ep.dist.locate_file("")).resolve() == _root
]


def report(**values):
    import json as _json
    print("REPORT " + _json.dumps(values, default=repr), flush=True)
"""


def run_fresh(
    code: str, packages: Packages, *, flags: tuple[str, ...] = (), timeout: float = 90
) -> dict[str, Any]:
    """Runs ``code`` in a new interpreter that sees ``packages``; returns what it passed to
    ``report(...)`` plus ``_rc``, ``_stdout`` and ``_stderr``. A script that hangs is killed
    after ``timeout`` seconds and reported as ``_rc = 'timeout'``."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(packages.root), env.get("PYTHONPATH", "")) if p
    )
    script = _ONLY_THESE_PACKAGES.format(root=str(packages.root)) + textwrap.dedent(code)
    try:
        proc = subprocess.run(
            [sys.executable, *flags, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=packages.root.parent,
        )
    except subprocess.TimeoutExpired as expired:
        return {
            "_rc": "timeout",
            "_stdout": _text(expired.stdout),
            "_stderr": _text(expired.stderr),
        }
    out: dict[str, Any] = {"_rc": proc.returncode, "_stdout": proc.stdout, "_stderr": proc.stderr}
    for line in proc.stdout.splitlines():
        if line.startswith("REPORT "):
            out.update(json.loads(line[len("REPORT ") :]))
    return out


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def explain(result: dict[str, Any]) -> str:
    """What a failed fresh interpreter said, for assertion messages."""
    return f"exit {result['_rc']}\n--- stdout\n{result['_stdout']}\n--- stderr\n{result['_stderr']}"
