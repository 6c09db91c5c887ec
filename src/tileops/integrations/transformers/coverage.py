"""Which tileops ops an enabled model's forward uses, read off what ``enable`` installed.

Read-only: each module ``enable`` served keeps its state (``planning/state.py``), which
names the op classes its forward calls, those it makes on first use (attention per shape)
included. Nothing here changes the model. A module's count is an upper bound of its use:
a projection folded into a stacked GEMM still holds its own.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .planning.state import state_of

__all__ = ["ops_used"]


def ops_used(model: Any) -> Counter:
    """Op name -> how many served modules call it (an upper bound of their calls), in the
    order the modules come."""
    uses: Counter = Counter()
    for _, module in model.named_modules():
        state = state_of(module)
        if state is not None:
            for name in state.op_names():
                uses[name] += 1
    return uses
