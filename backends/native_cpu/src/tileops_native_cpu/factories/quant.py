"""The quant family's factories (csrc/kernels/gemm_quant*.h): GEMMs over GGUF rows of GGML
blocks and over 4-bit groups, and the GGUF embedding lookup.

The GGML types are named here as tileops.quant.ggml_blocks names them (and numbered as GGUF
numbers them, the kernels' variant), so the builders need no tileops import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .._runtime import check_inputs, dtype_name, fail, native_dtype, shape_of, specialisation
from .common import Builder, Factory


class _Ggml(NamedTuple):
    name: str
    gguf_id: int
    block_size: int
    type_size: int


GGML_TYPES = {
    t.name: t
    for t in (
        _Ggml("F32", 0, 1, 4),
        _Ggml("F16", 1, 1, 2),
        _Ggml("BF16", 30, 1, 2),
        _Ggml("Q8_0", 8, 32, 34),
        _Ggml("Q4_0", 2, 32, 18),
        _Ggml("Q4_1", 3, 32, 20),
        _Ggml("Q4_K", 12, 256, 144),
        _Ggml("Q5_K", 13, 256, 176),
        _Ggml("Q6_K", 14, 256, 210),
    )
}
_OUT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _ggml(op: str, ggml_type: Any) -> _Ggml:
    found = GGML_TYPES.get(ggml_type.upper()) if isinstance(ggml_type, str) else None
    if found is None:
        raise fail(op, f"ggml_type must be one of {', '.join(GGML_TYPES)}", f"ggml_type={ggml_type!r}")
    return found


def gemm_gguf(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(activation: Any, weight: Any, *, ggml_type: str) -> Any:
            dtype = check_inputs(op, dtypes, activation=activation)
            check_inputs(op, (torch.uint8,), weight=weight)
            t = _ggml(op, ggml_type)
            a, w = shape_of(activation), shape_of(weight)
            if len(a) != 2 or len(w) != 2:
                raise fail(op, "activation and weight must be 2-D", f"activation {a}, weight {w}")
            if a[1] % t.block_size:
                raise fail(op, f"K must be a whole number of {t.name} blocks ({t.block_size} weights)", f"K={a[1]}")
            row = a[1] // t.block_size * t.type_size
            if w[1] != row:
                raise fail(
                    op,
                    f"weight rows of K={a[1]} weights as {t.name} blocks ({row} bytes)",
                    f"weight of shape {w}",
                )
            return specialisation(
                op,
                (dtype, t.name),
                f"{dtype_name(dtype)}, {t.name}",
                lambda C, threads, d: C.gemm_gguf(native_dtype(dtype), t.gguf_id, threads, d),
            )

        return build

    return factory


def gemm_w4a16(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(
            activation: Any, packed_weight: Any, weight_scale: Any, weight_zero: Any, *, group_size: int = 128
        ) -> Any:
            dtype = check_inputs(op, dtypes, activation=activation)
            check_inputs(op, (torch.uint8,), packed_weight=packed_weight)
            check_inputs(op, (torch.uint8,), weight_zero=weight_zero)
            check_inputs(op, (torch.float32, torch.float16), weight_scale=weight_scale)
            if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
                raise fail(op, "group_size must be an even int >= 2", f"group_size={group_size!r}")
            a, w, s, z = (shape_of(x) for x in (activation, packed_weight, weight_scale, weight_zero))
            if len(a) != 2 or len(w) != 2:
                raise fail(op, "activation and packed_weight must be 2-D", f"activation {a}, packed_weight {w}")
            if a[1] % group_size:
                raise fail(op, f"K must be a multiple of group_size={group_size}", f"K={a[1]}")
            if w[1] * 2 != a[1]:
                raise fail(op, f"packed_weight must be [N, K / 2] = [N, {a[1] // 2}]", f"packed_weight of shape {w}")
            want = (w[0], a[1] // group_size)
            if s != want or z != want:
                raise fail(op, f"weight_scale and weight_zero must be [N, K / group_size] = {want}", f"{s} and {z}")
            return specialisation(
                op,
                (dtype, group_size),
                f"{dtype_name(dtype)}, group_size={group_size}",
                lambda C, threads, d: C.gemm_w4a16(native_dtype(dtype), group_size, threads, d),
            )

        return build

    return factory


def embedding_gguf() -> Factory:
    def factory(op: str) -> Builder:
        def build(ids: Any, weight: Any, *, ggml_type: str, out_dtype: str = "bfloat16") -> Any:
            check_inputs(op, (torch.int32, torch.int64), ids=ids)
            check_inputs(op, (torch.uint8,), weight=weight)
            t = _ggml(op, ggml_type)
            out = _OUT_DTYPES.get(out_dtype) if isinstance(out_dtype, str) else None
            if out is None:
                raise fail(op, f"out_dtype must be one of {', '.join(_OUT_DTYPES)}", f"out_dtype={out_dtype!r}")
            i, w = shape_of(ids), shape_of(weight)
            if len(i) != 1 or len(w) != 2:
                raise fail(op, "ids must be 1-D and weight 2-D", f"ids {i}, weight {w}")
            if w[1] % t.type_size:
                raise fail(op, f"weight rows of whole {t.name} blocks ({t.type_size} bytes)", f"rows of {w[1]} bytes")
            return specialisation(
                op,
                (out, t.name),
                f"{out_dtype}, {t.name}",
                lambda C, threads, d: C.embedding_gguf(native_dtype(out), t.gguf_id, threads, d),
            )

        return build

    return factory


__all__ = ["GGML_TYPES", "embedding_gguf", "gemm_gguf", "gemm_w4a16"]
