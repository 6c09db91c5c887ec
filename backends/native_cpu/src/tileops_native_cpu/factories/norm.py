"""The norm family's factories (csrc/kernels/norm.h, csrc/bind/norm.cc): RMSNorm, LayerNorm,
fused add + either, GroupNorm."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .._runtime import check_inputs, dtype_name, fail, native_dtype, shape_of, specialisation
from .common import Builder, Factory


def _normalized(op: str, x: Any, normalized_shape: Sequence[int], **affine: Any) -> int:
    """The hidden size; x must end in normalized_shape, and each of ``affine`` be shaped so."""
    ns = tuple(int(s) for s in normalized_shape)
    if not ns:
        raise fail(op, "normalized_shape must not be empty", f"normalized_shape={ns}")
    if shape_of(x)[len(x.shape) - len(ns) :] != ns:
        raise fail(op, f"x must end in normalized_shape={ns}", f"x of shape {shape_of(x)}")
    for name, spec in affine.items():
        if shape_of(spec) != ns:
            raise fail(op, f"{name} must have shape normalized_shape={ns}", f"{name} of shape {shape_of(spec)}")
    return math.prod(ns)


def _row_norm(op: str, kind: str, x: Any, n: int, eps: float) -> Any:
    eps = float(eps)
    return specialisation(
        op,
        (x.dtype, n, eps),
        f"{dtype_name(x.dtype)}, hidden={n}, eps={eps}",
        lambda C, threads, d: C.row_norm(C.RowNorm[kind], native_dtype(x.dtype), n, eps, threads, d),
    )


def rms_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
            check_inputs(op, dtypes, x=x, weight=weight)
            return _row_norm(op, "rms", x, _normalized(op, x, normalized_shape, weight=weight), eps)

        return build

    return factory


def _fused_add(op: str, x: Any, residual: Any, **affine: Any) -> int:
    """The hidden size of a fused add + norm; refuses shapes its manifest refuses."""
    if len(x.shape) < 1:
        raise fail(op, "x must have at least 1 dim", f"x of shape {shape_of(x)}")
    if shape_of(residual) != shape_of(x):
        raise fail(op, f"residual must have x's shape {shape_of(x)}", f"residual of shape {shape_of(residual)}")
    n = int(x.shape[-1])
    for name, t in affine.items():
        if shape_of(t) != (n,):
            raise fail(op, f"{name} must have shape ({n},)", f"{name} of shape {shape_of(t)}")
    return n


def fused_add_rms_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, residual: Any, weight: Any, *, eps: float) -> Any:
            check_inputs(op, dtypes, x=x, residual=residual, weight=weight)
            return _row_norm(op, "fused_add_rms", x, _fused_add(op, x, residual, weight=weight), eps)

        return build

    return factory


def fused_add_layer_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, residual: Any, weight: Any, bias: Any, *, eps: float) -> Any:
            check_inputs(op, dtypes, x=x, residual=residual, weight=weight, bias=bias)
            return _row_norm(op, "fused_add_layer", x, _fused_add(op, x, residual, weight=weight, bias=bias), eps)

        return build

    return factory


def layer_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, bias: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
            check_inputs(op, dtypes, x=x, weight=weight, bias=bias)
            return _row_norm(op, "layer", x, _normalized(op, x, normalized_shape, weight=weight, bias=bias), eps)

        return build

    return factory


def group_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> Any:
            check_inputs(op, dtypes, x=x, weight=weight, bias=bias)
            if (weight is None) != (bias is None):
                raise fail(
                    op,
                    "weight and bias are given together or not at all",
                    f"weight={'None' if weight is None else 'given'}, bias={'None' if bias is None else 'given'}",
                )
            if len(x.shape) < 2:
                raise fail(op, "x must be [N, C, *spatial]", f"x of shape {shape_of(x)}")
            c = int(x.shape[1])
            for name, spec in (("weight", weight), ("bias", bias)):
                if spec is not None and shape_of(spec) != (c,):
                    raise fail(op, f"{name} must have shape (C,) = ({c},)", f"{name} of shape {shape_of(spec)}")
            if num_groups <= 0 or c % num_groups != 0:
                raise fail(op, "channels must split evenly into num_groups", f"C={c}, num_groups={num_groups}")
            if x.shape[0] * (c // num_groups) * math.prod(x.shape[2:]) == 1:
                raise fail(
                    op,
                    "a group must not hold exactly one value (N * C / num_groups * prod(spatial) != 1)",
                    f"x of shape {shape_of(x)}, num_groups={num_groups}",
                )
            affine, groups, eps_ = weight is not None, int(num_groups), float(eps)
            return specialisation(
                op,
                (x.dtype, groups, eps_, affine),
                f"{dtype_name(x.dtype)}, groups={groups}, affine={affine}, eps={eps_}",
                lambda C, threads, d: C.group_norm(native_dtype(x.dtype), groups, eps_, affine, threads, d),
            )

        return build

    return factory
