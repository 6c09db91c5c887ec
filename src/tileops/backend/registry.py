"""The tables, as Python sees them: thin wrappers over the engine's registry.

The engine (``tileops._C.Registry``) owns the tables and their transactional rollback;
this module validates arguments, names functions for error messages and makes every
read start discovery first (so a read never misses an installed backend).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _C
from . import discovery
from .errors import AmbiguousTargetError, BackendError, OpNotAvailableError, UnknownTargetError
from .types import BUILTIN, BuildKernel, Target, _Builtin

_C.set_error_classes(BackendError, UnknownTargetError, AmbiguousTargetError, OpNotAvailableError)

#: The process's one registry (the engine owns it). Private on purpose: a second public
#: path to the tables would be a second thing to keep consistent.
_registry = _C.process_registry


def describe_callable(fn: object) -> str:
    """``module.qualname`` of a function, the name errors print for it."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if qualname is None:
        return repr(fn)
    return f"{module}.{qualname}" if module else qualname


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty str, got {value!r}")
    return value


def register_detector(target: str, detect: Callable[[torch.device], bool]) -> None:
    """Register ``detect`` as the device predicate of ``target`` (once per target)."""
    _check_name("target", target)
    if not callable(detect):
        raise TypeError(f"detect for target {target!r} must be callable, got {detect!r}")
    _registry.register_detector(target, detect, describe_callable(detect))


def register_kernel_builder(op: str, target: str, build_kernel: BuildKernel) -> None:
    """Register the kernel builder of ``(op, target)`` (once per pair)."""
    _check_name("op", op)
    _check_name("target", target)
    if not callable(build_kernel):
        raise TypeError(f"build_kernel for ({op!r}, {target!r}) must be callable, got {build_kernel!r}")
    _registry.register_builder(op, target, build_kernel, describe_callable(build_kernel))


def layout_key(op: str, input: str) -> str:
    """The registry's name for the weight layout of ``op``'s ``input`` (kept beside the
    builders, so a backend's import registers it or rolls it back with them)."""
    return f"{op}.{input}:layout"


def register_weight_layout(op: str, target: str, input: str, prepare: Callable[..., torch.Tensor]) -> None:
    """Register the layout ``target``'s kernels of ``op`` want ``input`` in (a weight they
    read in an order of their own): ``prepare(tensor, **params)`` returns ``tensor`` in that
    layout, with the same shape, dtype and device. It runs once, where the weight is loaded
    (``op.prepare_weight(input, tensor)``), never per call; the kernels then receive the
    prepared tensor. Once per (op, target, input)."""
    _check_name("op", op)
    _check_name("target", target)
    _check_name("input", input)
    if not callable(prepare):
        raise TypeError(f"prepare for ({op!r}, {target!r}, {input!r}) must be callable, got {prepare!r}")
    _registry.register_builder(layout_key(op, input), target, prepare, describe_callable(prepare))


def registered_targets(op: str | None = None) -> list[str]:
    """Every registered target, sorted; with ``op``, those with a builder for it."""
    discovery.ensure_discovered()
    if op is None:
        return _registry.targets()
    return _registry.targets_for_op(_check_name("op", op))


def set_default_target(target: Target | None) -> None:
    """Process default, ahead of device detection: ``None`` restores detection,
    ``BUILTIN`` turns replacement off, a name must be registered."""
    discovery.ensure_discovered()
    if target is None:
        _registry.set_default("none", "")
    elif isinstance(target, _Builtin):
        _registry.set_default("builtin", "")
    elif isinstance(target, str):
        _registry.set_default("named", target)
    else:
        raise TypeError(f"a target is a registered name, BUILTIN or None; got {target!r}")


def default_target() -> Target | None:
    """The process default set by ``set_default_target``; ``None`` unless a program set one."""
    discovery.ensure_discovered()
    kind, name = _registry.default_target()
    if kind == "builtin":
        return BUILTIN
    return name if kind == "named" else None


def load_failures() -> list[str]:
    """One line per backend that failed to import:
    ``"{entry point name} ({entry point value}): {ExceptionType}: {message}"``."""
    discovery.ensure_discovered()
    return _registry.load_failures()
