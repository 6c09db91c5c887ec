"""Helpers for the protocol tests: real backend packages, fresh interpreters, one op.

A backend here is installed for real: a module plus a ``*.dist-info`` directory (METADATA
and ``entry_points.txt`` declaring the group ``tileops.backends``) in a site directory
that is put on ``sys.path`` (in-process) or ``PYTHONPATH`` (fresh interpreter). That is
all ``importlib.metadata`` needs to see an installed distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from _fake_backends import GROUP, PackageDir, explain, run_script

F16 = torch.float16
N = 64  # RMSNormFwdOp's normalized_shape in these tests

# Every backend module starts with the protocol's names, so a body may call them directly.
_PROTOCOL_IMPORTS = """\
from tileops.backend import (
    BUILTIN, TensorSpec, default_target, load_failures, register_detector,
    register_kernel_builder, registered_targets, set_default_target,
)


"""


class Site(PackageDir):
    """A directory of installed backend distributions."""

    imports = _PROTOCOL_IMPORTS

    def __init__(self, root: Path) -> None:
        super().__init__(root, f"{root.name}-events.log")

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
            self.write_module(module, body)
        self.write_dist(dist, entry_points, group)

    def backend(self, name: str, body: str) -> None:
        """The common case: distribution, entry point and module all called ``name``."""
        self.install(f"{name}_dist", {name: name}, {name: body})


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
    result = run_script(code, site, isolate=isolate, flags=flags, timeout=timeout)
    if expect_rc is not None and result["_rc"] != expect_rc:
        raise AssertionError(f"fresh interpreter (expected exit {expect_rc}): {explain(result)}")
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
