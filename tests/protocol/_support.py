"""Helpers for the protocol tests: real backend packages, fresh interpreters, one op.

A backend here is installed for real: a module plus a ``*.dist-info`` directory (METADATA
and ``entry_points.txt`` declaring the group ``tileops.backends``) in a site directory
that is put on ``sys.path`` (in-process) or ``PYTHONPATH`` (fresh interpreter). That is
all ``importlib.metadata`` needs to see an installed distribution.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

GROUP = "tileops.backends"
F16 = torch.float16
N = 64  # RMSNormFwdOp's normalized_shape in these tests

# Every backend module starts with this: the protocol imports and a `log` that appends
# one line to the site's event file (the only memory that survives a fresh interpreter).
_PRELUDE = """\
from tileops.backend import (
    BUILTIN, TensorSpec, default_target, load_failures, register_detector,
    register_kernel_builder, registered_targets, set_default_target,
)


def log(event):
    with open({log!r}, "a") as events:
        events.write(str(event) + "\\n")


log("imported " + __name__)
"""


class Site:
    """A directory of installed backend distributions."""

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
        """Install distribution ``dist``: its entry points and its modules' bodies.

        Each module body runs after the prelude (so it may call ``log`` and the protocol
        functions directly). A dotted module name makes a package (``pkg/__init__.py``).
        """
        for module, body in modules.items():
            *packages, leaf = module.split(".")
            folder = self.root.joinpath(*packages)
            folder.mkdir(parents=True, exist_ok=True)
            for depth in range(1, len(packages) + 1):
                init = self.root.joinpath(*packages[:depth], "__init__.py")
                if not init.exists():
                    init.write_text("")
            source = _PRELUDE.format(log=str(self.log_path)) + "\n" + textwrap.dedent(body)
            (folder / f"{leaf}.py").write_text(source)
        info = self.root / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")

    def backend(self, name: str, body: str) -> None:
        """The common case: distribution, entry point and module all called ``name``."""
        self.install(f"{name}_dist", {name: name}, {name: body})

    def events(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text().splitlines()

    def imports_of(self, module: str) -> int:
        return self.events().count(f"imported {module}")

    def owns(self, entry_point: Any) -> bool:
        """Whether an entry point comes from a distribution installed in this site."""
        dist = getattr(entry_point, "dist", None)
        if dist is None:
            return False
        return Path(dist.locate_file("")).resolve() == self.root.resolve()


# A fresh interpreter sees only the site's backends (not whatever else the environment
# may have installed): this wraps the discovery's entry point listing before anything
# reads the registry, so discovery still runs for the first time, on the caller's read.
_ISOLATE = """\
import pathlib as _pathlib
import tileops.backend.discovery as _discovery

_site = _pathlib.Path({site!r}).resolve()
_all_entry_points = _discovery._entry_points
_discovery._entry_points = lambda: [
    ep for ep in _all_entry_points()
    if getattr(ep, "dist", None) is not None
    and _pathlib.Path(ep.dist.locate_file("")).resolve() == _site
]
"""

_REPORT = """
import json as _json
def report(**values):
    print("RESULT " + _json.dumps(values, default=repr), flush=True)
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
    """Run ``code`` in a fresh interpreter; return what it passed to ``report(...)``.

    The script may call ``report(key=value, ...)`` (JSON-serialisable values). With a
    site, the site is on PYTHONPATH and (``isolate``) discovery only sees its backends.
    """
    prelude = _REPORT
    if site is not None and isolate:
        prelude += _ISOLATE.format(site=str(site.root))
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site.root), env.get("PYTHONPATH", "")) if p
        )
    cwd = site.root.parent if site is not None else None
    proc = subprocess.run(
        [sys.executable, *flags, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    if expect_rc is not None and proc.returncode != expect_rc:
        raise AssertionError(
            f"fresh interpreter exited {proc.returncode} (expected {expect_rc})\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    result: dict[str, Any] = {"_rc": proc.returncode, "_stderr": proc.stderr}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT ") :]))
    return result


# ---- one op to run: RMSNormFwdOp on (4, 64) float16 -----------------------------------


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


def _rms(x: torch.Tensor, w: torch.Tensor, *, normalized_shape: Any, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)


def rms_builder(calls: list | None = None, tag: str = "") -> Callable[..., Any]:
    """A working RMSNormFwdOp builder; appends ``tag`` to ``calls`` each time it builds."""

    def build_rms_norm(x: Any, weight: Any, *, normalized_shape: Any, eps: float) -> Any:
        if calls is not None:
            calls.append(tag)
        return lambda x, w: _rms(x, w, normalized_shape=normalized_shape, eps=eps)

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


CUDA_ONLY_ON_CPU = "RMSNormKernel is a CUDA kernel; got x on cpu and weight on cpu."
