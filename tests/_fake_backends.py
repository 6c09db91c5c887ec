"""Backend packages installed for real, and fresh interpreters that discover them.

Shared by the protocol and reliability suites. A package here is what ``pip install``
leaves behind: a module plus a ``*.dist-info`` folder whose ``entry_points.txt`` declares
the group ``tileops.backends``, in a folder on ``sys.path`` (this process) or
``PYTHONPATH`` (a fresh interpreter). That is all ``importlib.metadata`` needs. Every
module starts by appending ``imported <module>`` to the folder's event log, so a test can
count imports even across interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GROUP = "tileops.backends"

_LOG_PRELUDE = """\
def log(event):
    with open({log!r}, "a") as _events:
        _events.write(str(event) + "\\n")


log("imported " + __name__)
"""


class PackageDir:
    """A folder of installed backend distributions with one event log.

    ``imports`` is source put before the log prelude of every module (e.g. the protocol's
    names, so module bodies may call them directly).
    """

    imports = ""

    def __init__(self, root: Path, log_name: str) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = root.parent / log_name

    def write_module(self, module: str, body: str) -> None:
        """``module``'s source: the prelude, then ``body``. A dotted name makes packages."""
        *packages, leaf = module.split(".")
        folder = self.root.joinpath(*packages)
        folder.mkdir(parents=True, exist_ok=True)
        for depth in range(1, len(packages) + 1):
            init = self.root.joinpath(*packages[:depth], "__init__.py")
            if not init.exists():
                init.write_text("")
        prelude = self.imports + _LOG_PRELUDE.format(log=str(self.log_path))
        (folder / f"{leaf}.py").write_text(prelude + "\n" + textwrap.dedent(body))

    def write_dist(self, dist: str, entry_points: Mapping[str, str], group: str = GROUP) -> None:
        """Distribution ``dist``'s metadata, declaring ``entry_points`` in ``group``."""
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")

    def events(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def imports_of(self, module: str) -> int:
        return self.events().count(f"imported {module}")

    def owns(self, entry_point: Any) -> bool:
        """Whether an entry point comes from a distribution installed in this folder."""
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
"""

_REPORT = """\
import json as _json


def report(**values):
    print("REPORT " + _json.dumps(values, default=repr), flush=True)
"""


def run_script(
    code: str,
    packages: PackageDir | None = None,
    *,
    isolate: bool = True,
    flags: tuple[str, ...] = (),
    timeout: float = 90,
) -> dict[str, Any]:
    """Runs ``code`` in a new interpreter; returns what it passed to ``report(...)`` plus
    ``_rc``, ``_stdout`` and ``_stderr``. With ``packages``, their folder is on PYTHONPATH
    and (``isolate``) discovery sees only them. A script that hangs is killed after
    ``timeout`` seconds and reported as ``_rc = 'timeout'``."""
    script = _REPORT
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    cwd = None
    if packages is not None:
        if isolate:
            script += _ONLY_THESE_PACKAGES.format(root=str(packages.root))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(packages.root), env.get("PYTHONPATH", "")) if p
        )
        cwd = packages.root.parent
    try:
        proc = subprocess.run(
            [sys.executable, *flags, "-c", script + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
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
