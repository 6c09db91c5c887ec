"""Fake backends for the test suites: packages installed for real, fresh interpreters that
discover them, and one op to run through them.

A package here is what ``pip install`` leaves behind: a module plus a ``*.dist-info``
folder whose ``entry_points.txt`` declares the group ``tileops.backends``, in a site folder
on ``sys.path`` (this process) or ``PYTHONPATH`` (a fresh interpreter). That is all
``importlib.metadata`` needs. Every module starts with the protocol's names (so a body may
call ``register_detector`` and the rest directly) and by appending ``imported <module>``
to the site's event log, so a test can count imports even across interpreters.

The fixtures ``site`` (this process) and ``fresh_site`` (fresh interpreters only) live in
tests/conftest.py; a fresh interpreter is started with ``run_fresh``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from tileops.backend import registered_targets

GROUP = "tileops.backends"

_PRELUDE = """\
from tileops.backend import (
    BUILTIN, TensorSpec, default_target, load_failures, register_detector,
    register_kernel_builder, registered_targets, set_default_target,
)


def log(event):
    with open({log!r}, "a") as _events:
        _events.write(str(event) + "\\n")


log("imported " + __name__)
"""


class Site:
    """A site folder of installed backend distributions, with one event log beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = root.parent / f"{root.name}-events.log"

    def install(
        self,
        dist: str,
        entry_points: Mapping[str, str],
        modules: Mapping[str, str],
        group: str = GROUP,
    ) -> None:
        """Install distribution ``dist``: its entry points (name -> value) in ``group`` and
        its modules' bodies. A dotted module name makes packages (``pkg/__init__.py``)."""
        for module, body in modules.items():
            self._write_module(module, body)
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
        importlib.invalidate_caches()  # a folder already on sys.path changed

    def backend(self, name: str, body: str) -> None:
        """The common case: entry point and module called ``name`` (distribution
        ``<name>_dist``), the module's source ``body``."""
        self.install(f"{name}_dist", {name: name}, {name: body})

    def _write_module(self, module: str, body: str) -> None:
        *packages, leaf = module.split(".")
        folder = self.root.joinpath(*packages)
        folder.mkdir(parents=True, exist_ok=True)
        for depth in range(1, len(packages) + 1):
            init = self.root.joinpath(*packages[:depth], "__init__.py")
            if not init.exists():
                init.write_text("")
        prelude = _PRELUDE.format(log=str(self.log_path))
        (folder / f"{leaf}.py").write_text(prelude + "\n" + textwrap.dedent(body))

    def events(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def imports_of(self, module: str) -> int:
        return self.events().count(f"imported {module}")

    def owns(self, entry_point: Any) -> bool:
        """Whether an entry point comes from a distribution installed in this site."""
        dist = getattr(entry_point, "dist", None)
        if dist is None:
            return False
        return Path(dist.locate_file("")).resolve() == self.root.resolve()


# ---- fresh interpreters ---------------------------------------------------------------

# A fresh interpreter discovers only the packages of its site (the environment may hold
# real backends too, e.g. the sanitizer job's): discovery's listing is filtered before
# anything reads the registry, so discovery still happens for the first time in the script.
_ONLY_THIS_SITE = """\
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


def run_fresh(
    code: str,
    *,
    site: Site | None = None,
    isolate: bool = True,
    flags: tuple[str, ...] = (),
    timeout: float = 120,
    expect_rc: int | None = 0,
) -> dict[str, Any]:
    """Runs ``code`` in a new interpreter; returns what it passed to ``report(key=value,
    ...)`` (JSON-serialisable values) plus ``_rc``, ``_stdout`` and ``_stderr``.

    With ``site``, the site is on PYTHONPATH and (``isolate``) discovery sees only its
    backends. A script that hangs is killed after ``timeout`` seconds and reported as
    ``_rc = 'timeout'``. An exit status other than ``expect_rc`` fails the calling test
    with what the interpreter said; ``expect_rc=None`` leaves the check to the caller.
    """
    script = _REPORT
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    cwd = None
    if site is not None:
        if isolate:
            script += _ONLY_THIS_SITE.format(root=str(site.root))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site.root), env.get("PYTHONPATH", "")) if p)
        cwd = site.root.parent
    try:
        proc = subprocess.run(
            [sys.executable, *flags, "-c", script + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
        )
        result: dict[str, Any] = {
            "_rc": proc.returncode,
            "_stdout": proc.stdout,
            "_stderr": proc.stderr,
        }
    except subprocess.TimeoutExpired as expired:
        result = {
            "_rc": "timeout",
            "_stdout": _text(expired.stdout),
            "_stderr": _text(expired.stderr),
        }
    for line in result["_stdout"].splitlines():
        if line.startswith("REPORT "):
            result.update(json.loads(line[len("REPORT ") :]))
    if expect_rc is not None and result["_rc"] != expect_rc:
        raise AssertionError(f"fresh interpreter (expected exit {expect_rc}): {explain(result)}")
    return result


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def explain(result: dict[str, Any]) -> str:
    """What a fresh interpreter said, for assertion messages."""
    return f"exit {result['_rc']}\n--- stdout\n{result['_stdout']}\n--- stderr\n{result['_stderr']}"


# ---- one op to run: RMSNormFwdOp on (4, 64) float16 -----------------------------------

F16 = torch.float16
N = 64  # RMSNormFwdOp's normalized_shape in these tests

CUDA_ONLY_ON_CPU = "RMSNormKernel is a CUDA kernel; got x on cpu and weight on cpu."


# ---- backend bodies and discovery -----------------------------------------------------


def good(target: str) -> str:
    """A backend body registering ``target`` (claims nothing) with an RMSNorm builder."""
    return textwrap.dedent(f"""
    import torch

    register_detector({target!r}, lambda device: False)

    def build_rms_norm(x, weight, *, normalized_shape, eps):
        return lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)

    register_kernel_builder("RMSNormFwdOp", {target!r}, build_rms_norm)
    """)


def discover() -> list[warnings.WarningMessage]:
    """Run discovery (through a registry read) and return the warnings it issued."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registered_targets()
    return list(caught)


def rms_inputs(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    if device == "meta":
        return (
            torch.empty(4, N, dtype=F16, device="meta"),
            torch.empty(N, dtype=F16, device="meta"),
        )
    return (torch.randn(4, N, dtype=F16, device=device), torch.randn(N, dtype=F16, device=device))


def rms_op(**kwargs: Any) -> Any:
    from tileops.ops import RMSNormFwdOp

    return RMSNormFwdOp(normalized_shape=(N,), **kwargs)


def rms_reference(x: torch.Tensor, w: torch.Tensor, *, normalized_shape: Any, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)


def rms_builder(calls: list | None = None, tag: str = "") -> Callable[..., Any]:
    """A working RMSNormFwdOp builder; appends ``tag`` to ``calls`` each time it builds."""

    def build_rms_norm(x: Any, weight: Any, *, normalized_shape: Any, eps: float) -> Any:
        if calls is not None:
            calls.append(tag)
        return lambda x, w: rms_reference(x, w, normalized_shape=normalized_shape, eps=eps)

    return build_rms_norm


def cpu_in_tree(calls: list | None = None) -> dict[str, Any]:
    """A ``kernel_map`` whose in-tree RMSNorm kernel runs on any device, so that choosing
    the in-tree kernels (``BUILTIN``) is observable on a machine without CUDA."""

    def in_tree_factory(specs: Any, **params: Any) -> Any:
        if calls is not None:
            calls.append("in-tree")
        shape, eps = tuple(params["normalized_shape"]), params["eps"] or 1e-6
        return lambda x, w: torch.nn.functional.rms_norm(x, shape, w, eps)

    return {"rms_norm": in_tree_factory}


def name_of(fn: Any) -> str:
    """How protocol errors name a function: module.qualname."""
    return f"{fn.__module__}.{fn.__qualname__}"
