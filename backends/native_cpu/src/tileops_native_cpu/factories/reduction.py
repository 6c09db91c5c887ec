"""The reduction family's factory (csrc/kernels/reduction.h): sum, mean, amax."""

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


def reduction(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, *, dim: int | Sequence[int] | None, keepdim: bool) -> Any:
            check_inputs(op, dtypes, x=x)
            ndim, rank = len(x.shape), max(len(x.shape), 1)
            dims = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
            for d in dims:
                if not -rank <= d < rank:
                    raise fail(
                        op, f"every dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {shape_of(x)}"
                    )
            if len({d % rank for d in dims}) != len(dims):
                raise fail(op, "dims must not repeat", f"dim={dim} for x of shape {shape_of(x)}")
            axes = set(range(ndim)) if not dims else {d % rank for d in dims} if ndim else set()
            if kind == "amax" and any(x.shape[a] == 0 for a in axes):
                raise fail(op, "amax over an empty axis has no value", f"x of shape {shape_of(x)}, dim={dim}")
            mask = [a in axes for a in range(ndim)]
            keep = bool(keepdim)
            return specialisation(
                op,
                (x.dtype, tuple(mask), keep),
                f"{dtype_name(x.dtype)}, dim={sorted(axes)}, keepdim={keep}",
                lambda C, threads, d: C.reduce(C.ReduceOp[kind], native_dtype(x.dtype), mask, keep, threads, d),
            )

        return build

    return factory
