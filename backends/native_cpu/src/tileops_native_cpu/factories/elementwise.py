"""The elementwise family's factories (csrc/kernels/elementwise.h): add and mul, activations,
gated activations, clamp."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._runtime import (
    ALL_DTYPES,
    FLOATS,
    check_broadcast,
    check_inputs,
    dtype_name,
    fail,
    native_dtype,
    shape_of,
    specialisation,
)
from .common import Builder, Factory


def _representable(value: int | float, dtype: torch.dtype) -> bool:
    if dtype == torch.bool:
        return True
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min <= value <= info.max


def binary(kind: str, dtypes: Sequence[torch.dtype] = ALL_DTYPES) -> Factory:
    """``kind`` a member of _C.BinaryOp; ``add`` takes ``alpha`` (out = input + alpha * other)."""

    def make(op: str, x: Any, y: Any, alpha: int | float) -> Any:
        dtype = check_inputs(op, dtypes, input=x, other=y)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise fail(op, "alpha must be an int or a float", f"alpha={alpha!r}")
        if not dtype.is_floating_point and not isinstance(alpha, int):
            raise fail(op, f"alpha must be an int for {dtype_name(dtype)} tensors", f"alpha={alpha!r}")
        if not _representable(alpha, dtype):
            raise fail(op, f"alpha must be representable in {dtype_name(dtype)}", f"alpha={alpha!r}")
        check_broadcast(op, "input and other", x, y)
        a = float(alpha)
        return specialisation(
            op,
            (dtype, a),
            f"{dtype_name(dtype)}" + (f", alpha={alpha}" if kind == "add" else ""),
            lambda C, threads, d: C.binary(C.BinaryOp[kind], native_dtype(dtype), a, threads, d),
        )

    def factory(op: str) -> Builder:
        if kind == "add":

            def build_add(input: Any, other: Any, *, alpha: int | float = 1) -> Any:  # noqa: A002 (manifest name)
                return make(op, input, other, alpha)

            return build_add

        def build(input: Any, other: Any) -> Any:  # noqa: A002
            return make(op, input, other, 1)

        return build

    return factory


def _unary_kernel(op: str, activation: str, x: Any, inplace: bool) -> Any:
    return specialisation(
        op,
        (x.dtype, activation, inplace),
        f"{dtype_name(x.dtype)}, inplace={inplace}",
        lambda C, threads, d: C.unary(C.Activation[activation], native_dtype(x.dtype), inplace, threads, d),
    )


def activation(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """``kind`` a member of _C.Activation; the op takes ``inplace`` (writes ``input``)."""

    def factory(op: str) -> Builder:
        def build(input: Any, *, inplace: bool = False) -> Any:  # noqa: A002
            check_inputs(op, dtypes, input=input)
            return _unary_kernel(op, kind, input, bool(inplace))

        return build

    return factory


def activation_by_approximate(kinds: dict[str, str], dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """An op whose ``approximate`` param picks the _C.Activation (GeluFwdOp)."""

    def factory(op: str) -> Builder:
        def build(input: Any, *, approximate: str = "none") -> Any:  # noqa: A002
            check_inputs(op, dtypes, input=input)
            if approximate not in kinds:
                raise fail(op, f"approximate must be one of {sorted(kinds)}", f"approximate={approximate!r}")
            return _unary_kernel(op, kinds[approximate], input, False)

        return build

    return factory


def gated(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """act(x[:, :N]) * x[:, N:] for x [M, 2N], ``kind`` a member of _C.Activation that the
    gated kernel is compiled for (``GatedActivations`` in csrc/kernels/elementwise.h)."""

    def factory(op: str) -> Builder:
        def build(x: Any) -> Any:
            check_inputs(op, dtypes, x=x)
            if len(x.shape) != 2 or x.shape[1] % 2 != 0:
                raise fail(
                    op, "x must be [M, 2N] ([gate | value], 2-D with an even last dim)", f"x of shape {shape_of(x)}"
                )
            return specialisation(
                op,
                (x.dtype,),
                dtype_name(x.dtype),
                lambda C, threads, d: C.gated(C.Activation[kind], native_dtype(x.dtype), threads, d),
            )

        return build

    return factory


def clamp(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(input: Any, min: Any, max: Any) -> Any:  # noqa: A002
            dtype = check_inputs(op, dtypes, input=input, min=min, max=max)
            if min is None and max is None:
                raise fail(op, "at least one of min and max must be given", "min=None, max=None")
            check_broadcast(op, "input, min and max", input, min, max)
            has_min, has_max = min is not None, max is not None
            describe = f"{dtype_name(dtype)}, min={'tensor' if has_min else None}, max={'tensor' if has_max else None}"
            return specialisation(
                op,
                (dtype, has_min, has_max),
                describe,
                lambda C, threads, d: C.clamp(native_dtype(dtype), has_min, has_max, threads, d),
            )

        return build

    return factory
