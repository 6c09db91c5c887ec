"""Which tileops ops an enabled model's forward uses, read off what ``enable`` installed.

Read-only: ``enable`` leaves on each module it patched a ``_tileops`` namespace holding
the op instances that module's forward calls (``gemm``, ``norm``, ``act``, ``rope``; a
fused decoder layer's ``add_norm``), objects that hold ops in turn (a stacked projection's
``gemm``), and for attention the factories that make the prefill ops on first use (one
per distinct shape class). The ops those factories make are named by the factory's code,
so they are read from it without calling it. Nothing here changes the model or the patch.
A module's count is an upper bound of its use: a projection folded into a stacked GEMM
still holds its own.
"""

from __future__ import annotations

import types
from collections import Counter
from typing import Any


def _op_names() -> set[str]:
    from tileops import manifest

    return set(manifest.all_entries())


def _made_by(factory: Any, declared: set[str], depth: int = 0) -> list[str]:
    """Op classes a factory (a closure over a ``lambda: ops.XxxOp(...)``) constructs."""
    if depth > 3 or not callable(factory):
        return []
    found: list[str] = []
    code = getattr(factory, "__code__", None)
    if code is not None:
        found += [name for name in code.co_names if name in declared]
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found += [name for name in const.co_names if name in declared]
    for cell in getattr(factory, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(inner, types.FunctionType):
            found += _made_by(inner, declared, depth + 1)
    return found


def ops_used(model: Any) -> Counter:
    """Op name -> how many patched modules hold it (an upper bound of their calls), in the
    order the modules come."""
    from tileops.ops.op import Op

    declared = _op_names()
    uses: Counter = Counter()
    for _, module in model.named_modules():
        state = getattr(module, "_tileops", None)
        if not isinstance(state, types.SimpleNamespace):
            continue
        names = _held(module, vars(state), declared, Op)
        for name in dict.fromkeys(names):
            uses[name] += 1
    return uses


def _held(module: Any, state: dict[str, Any], declared: set[str], op_class: type, depth: int = 0) -> list[str]:
    import torch

    names: list[str] = []
    for key, value in state.items():
        if key == "add" and not _has_bias(module, value):
            continue  # a Linear's add serves its bias only (_forwards.linear_rows)
        if isinstance(value, op_class):
            names.append(type(value).__name__)
        elif isinstance(value, types.FunctionType):
            names += _made_by(value, declared)
        elif (depth == 0 and hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.Tensor, type))
              and not isinstance(value, types.ModuleType)):
            names += _held(value, vars(value), declared, op_class, depth + 1)
    return names


def _has_bias(owner: Any, _add: Any) -> bool:
    """Whether the Linear (or stacked Linears) that holds an ``add`` has a bias to add."""
    return getattr(owner, "bias", True) is not None
