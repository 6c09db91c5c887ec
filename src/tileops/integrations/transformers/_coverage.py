"""Which tileops ops an enabled model's forward uses, read off what ``enable`` installed.

Read-only: ``enable`` leaves on each module it patched a ``_tileops`` namespace holding
the op instances that module's forward calls (``gemm``, ``norm``, ``act``, ``rope``), and
for attention the factories that make the prefill and decode ops on first use (one per
distinct shape class). The ops those factories make are named by the factory's code, so
they are read from it without calling it. Nothing here changes the model or the patch.
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
    """Op name -> how many patched modules call it, in the order the modules come."""
    from tileops.ops.op import Op

    declared = _op_names()
    uses: Counter = Counter()
    for _, module in model.named_modules():
        state = getattr(module, "_tileops", None)
        if not isinstance(state, types.SimpleNamespace):
            continue
        names: list[str] = []
        for key, value in vars(state).items():
            if key == "add" and getattr(module, "bias", True) is None:
                continue  # a Linear's add serves its bias only (_patch._linear_forward)
            if isinstance(value, Op):
                names.append(type(value).__name__)
            elif isinstance(value, types.FunctionType):
                names += _made_by(value, declared)
        for name in dict.fromkeys(names):
            uses[name] += 1
    return uses
