"""The softmax family's factory (csrc/kernels/softmax.h): softmax and log-softmax."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._runtime import (
    FLOATS,
    check_inputs,
    dtype_name,
    fail,
    native_dtype,
    shape_of,
    specialisation,
)
from .common import Builder, Factory


def softmax(*, log: bool, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, *, dim: int | None) -> Any:
            check_inputs(op, dtypes, x=x)
            ndim = len(x.shape)
            axis = (0 if ndim in (0, 1, 3) else 1) if dim is None else dim
            rank = max(ndim, 1)
            if not -rank <= axis < rank:
                raise fail(op, f"dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {shape_of(x)}")
            axis %= rank
            return specialisation(
                op,
                (x.dtype, axis),
                f"{dtype_name(x.dtype)}, dim={axis}",
                lambda C, threads, d: C.softmax(native_dtype(x.dtype), axis, log, threads, d),
            )

        return build

    return factory
