"""How the op layer reads the tables: choosing a target, finding a builder.

Op instances call these on their first call (settling) and on memo misses; nothing here
runs on a memo hit.
"""

from __future__ import annotations

from typing import Any

import torch

from . import discovery
from .registry import _registry, layout_key
from .types import BUILTIN, Target, _Builtin


def request(target: Target | None) -> tuple[str, str]:
    """A constructor's ``target=`` as the engine's request. ``None`` means "decide at the
    first call"; a name is checked against the registry there too (C4), so an unknown
    one raises ``UnknownTargetError`` at the first call, not at construction."""
    discovery.ensure_discovered()
    if target is None:
        return ("detect", "")
    if isinstance(target, _Builtin):
        return ("builtin", "")
    if isinstance(target, str) and target:
        return ("named", target)
    raise TypeError(f"target= takes a registered name, BUILTIN or None; got {target!r}")


def settle(requested: tuple[str, str], device: torch.device) -> Target:
    """The target that serves an instance whose first call is on ``device``."""
    kind, name = _registry.settle(requested[0], requested[1], device, str(device))
    return BUILTIN if kind == "builtin" else name


def claims(target: str, device: torch.device) -> bool:
    """Whether ``target``'s detector claims ``device`` (a settled instance meeting a new one)."""
    return _registry.target_claims(target, device, str(device))


def builder(op: str, target: str):
    return _registry.builder(op, target)


def weight_layout(op: str, input: str, target: str) -> Any:
    """``target``'s ``prepare`` for ``op``'s ``input`` (``register_weight_layout``), or None."""
    key = layout_key(op, input)
    return _registry.builder(key, target) if target in _registry.targets_for_op(key) else None


def targets_for(op: str) -> list[str]:
    return _registry.targets_for_op(op)


def any_target_claims(device: torch.device) -> bool:
    """Whether some registered detector claims ``device`` (G1's second sentence)."""
    return bool(_registry.claimants(device))
