"""Shrinking a workload to CPU size without breaking the op's rules.

Every distinct dim value of the original case is a class ("4096", "128", ...). A step
halves one class (a leading dim before an innermost one, then the largest)
everywhere it occurs — in every input shape and in every int param that
spells the same value (normalized_shape, rotary_dim) — so equalities between dims survive
by construction. Divisibility and parity rules (K % 16, H % H_kv, even head_dim,
C % num_groups) are not modelled here: each step is re-checked against the entry's own
param and shape rules, and a step that breaks one is undone and that class left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

Shape = tuple[int, ...]


class OpEntry(Protocol):
    """What scaling asks of a manifest entry (``_entry.OpEntry``, which calls this module)."""

    def init_params(self, given: Mapping[str, object]) -> dict[str, Any]: ...

    def check_inputs(self, specs: Sequence[object | None], params: Mapping[str, Any]) -> None: ...

    def case_specs(self, shapes: Mapping[str, Shape | None], dtype: torch.dtype) -> list[Any]: ...

    def output_meta(
        self, specs: Sequence[object | None], params: Mapping[str, Any]
    ) -> list[tuple[torch.dtype, Shape]]: ...


BUDGET = 1 << 21  # elements per tensor (inputs and outputs)
_FLOOR = 16  # never halve a dim below this: keeps tiles, K % 16 and head groups sensible
# "small": an eighth of that, the same tiles and rules (the sanitizer job's conformance run).
SMALL_BUDGET = 1 << 18
# "tiny": a few hundred elements, for tests that run thousands of calls (hostile inputs).
TINY_BUDGET, TINY_FLOOR = 512, 2


def _map_param(value: Any, sizes: dict[int, int]) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return sizes.get(value, value)
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(sizes.get(v, v) for v in value)
    return value


def _valid(entry: OpEntry, shapes: dict[str, Shape | None], params: dict[str, Any], dtype: torch.dtype) -> bool:
    try:
        entry.init_params(params)
        entry.check_inputs(entry.case_specs(shapes, dtype), params)
    except (TypeError, ValueError):
        return False
    return True


def scale_case(
    entry: OpEntry,
    shapes: dict[str, Shape | None],
    params: dict[str, Any],
    dtype: torch.dtype,
    *,
    budget: int = BUDGET,
    floor: int = _FLOOR,
) -> tuple[dict[str, Shape | None], dict[str, Any]]:
    classes = sorted({d for s in shapes.values() if s for d in s if d >= 2 * floor})
    sizes = {v: v for v in classes}
    frozen: set[int] = set()
    innermost = {s[-1] for s in shapes.values() if s}

    def mapped() -> tuple[dict[str, Shape | None], dict[str, Any]]:
        return (
            {k: None if s is None else tuple(sizes.get(d, d) for d in s) for k, s in shapes.items()},
            {k: _map_param(v, sizes) for k, v in params.items()},
        )

    cur_shapes, cur_params = mapped()
    while True:
        big_inputs = [k for k, s in cur_shapes.items() if s is not None and math.prod(s) > budget]
        big_output = any(
            math.prod(shape) > budget for _, shape in entry.output_meta(entry.case_specs(cur_shapes, dtype), cur_params)
        )
        if not big_inputs and not big_output:
            return cur_shapes, cur_params
        # Shrink what the oversized inputs are made of; an oversized output (broadcast)
        # may shrink through any dim.
        pool = {d for k in big_inputs for d in shapes[k] or ()} if big_inputs else set(classes)
        candidates = [
            v for v in classes if v in pool and v not in frozen and sizes[v] % 2 == 0 and sizes[v] // 2 >= floor
        ]
        if not candidates:
            return cur_shapes, cur_params  # best effort; the caller's tests check the budget
        # Leading dims (rows, batch, sequence) go first: they only repeat the work, while
        # the innermost dim is what distinguishes one workload's kernel from another's.
        v = max(candidates, key=lambda c: (c not in innermost, sizes[c], c))
        sizes[v] //= 2
        new_shapes, new_params = mapped()
        if _valid(entry, new_shapes, new_params, dtype):
            cur_shapes, cur_params = new_shapes, new_params
        else:
            sizes[v] *= 2
            frozen.add(v)
