"""The gemm family's factories (csrc/kernels/gemm*.h): GEMM and batched GEMM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._runtime import check_inputs, dtype_name, fail, native_dtype, shape_of, specialisation
from .common import Builder, Factory


def _gemm_kernel(op: str, dtype: torch.dtype, batched: bool, trans_a: bool, trans_b: bool) -> Any:
    describe = dtype_name(dtype) + ("" if batched else f", trans_a={trans_a}, trans_b={trans_b}")
    return specialisation(
        op,
        (dtype, trans_a, trans_b),
        describe,
        lambda C, threads, d: C.gemm(native_dtype(dtype), batched, trans_a, trans_b, threads, d),
    )


def gemm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(a: Any, b: Any, *, trans_a: bool, trans_b: bool) -> Any:
            dtype = check_inputs(op, dtypes, a=a, b=b)
            if len(a.shape) != 2 or len(b.shape) != 2:
                raise fail(op, "a and b must be 2-D", f"a of shape {shape_of(a)}, b of shape {shape_of(b)}")
            k_a = a.shape[0] if trans_a else a.shape[1]
            k_b = b.shape[1] if trans_b else b.shape[0]
            if k_a != k_b:
                raise fail(
                    op,
                    "a and b must share K",
                    f"K={k_a} from a {shape_of(a)} (trans_a={trans_a}) "
                    f"and K={k_b} from b {shape_of(b)} (trans_b={trans_b})",
                )
            return _gemm_kernel(op, dtype, False, bool(trans_a), bool(trans_b))

        return build

    return factory


def bmm(dtypes: Sequence[torch.dtype], *, k_multiple: int = 1) -> Factory:
    def factory(op: str) -> Builder:
        def build(a: Any, b: Any) -> Any:
            dtype = check_inputs(op, dtypes, a=a, b=b)
            if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
                raise fail(
                    op, "a must be [B, M, K] and b [B, K, N]", f"a of shape {shape_of(a)}, b of shape {shape_of(b)}"
                )
            if a.shape[2] % k_multiple:
                raise fail(op, f"K must be a multiple of {k_multiple}", f"K={a.shape[2]} from a of shape {shape_of(a)}")
            return _gemm_kernel(op, dtype, True, False, False)

        return build

    return factory
