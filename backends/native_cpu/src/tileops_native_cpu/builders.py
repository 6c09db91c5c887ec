"""The ``build_kernel`` of every op for the ``native_cpu`` target: the table ``BUILDERS``.

This module does not import tileops' op layer (the RoPE builders take their tables from
``tileops.rope_tables``, which imports torch only): a builder only reads ``.device``,
``.dtype`` and ``.shape`` of each spec (``TensorSpec`` is duck-typed), so the builders can be
tested and benchmarked without the op layer.

A builder accepts exactly what the op's manifest (``src/tileops/manifest/*.yaml``) accepts:
it refuses anything else with an error naming what was expected and what arrived (the op
layer checks the manifest first, but tests and benchmarks call builders directly). It then
fixes the compile-time values (dtype, hidden size, head dim, group size, transposes, axes)
and returns a C++ kernel object whose ``__call__`` is a C++ type slot. Row counts, batch and
sequence lengths are read from the tensors at call time, so kernels are kept in one LRU of
specialisations keyed by the compile-time values only: the op layer calls a builder once
per input shape (every decode step is a new shape), and a new row count must not cost a new
kernel.

Dtypes and kinds cross into C++ as the extension's enums (``_C.DType``, ``_C.RowNorm``,
``_C.ReduceOp``, ``_C.BinaryOp``, ``_C.Activation``, ``_C.RopeLayout``, ``_C.RopeRotation``).
The table names kinds by their member names, because importing this module must load nothing.

Threads: a kernel is sized to ``torch.get_num_threads()`` as read when it is built (the
value is part of the specialisation key).

A new op with a native kernel is one line in ``_TABLE`` (op name -> a builder factory of
its family, ``factories/<family>.py``); see the README for the C++ side. Shared machinery (the
extension, the specialisation LRU, the input checks) is in ``_runtime.py``.
"""

from __future__ import annotations

import torch

from ._runtime import (
    ALL_DTYPES,
    FLOATS,
    HALVES,
    INTEGRAL,
    MAX_DIMS,
    TARGET,
    native,
    native_dtype,
    specialisations,
)
from .factories.attention import attention
from .factories.common import Builder, Factory
from .factories.elementwise import activation, activation_by_approximate, binary, clamp, gated
from .factories.gemm import bmm, gemm
from .factories.moe import fused_moe, fused_topk
from .factories.norm import (
    fused_add_layer_norm,
    fused_add_rms_norm,
    group_norm,
    layer_norm,
    rms_norm,
)
from .factories.quant import embedding_gguf, gemm_gguf, gemm_w4a16
from .factories.reduction import reduction
from .factories.rope import rope, rope_position_ids
from .factories.softmax import softmax

__all__ = [
    "ALL_DTYPES",
    "BUILDERS",
    "FLOATS",
    "HALVES",
    "INTEGRAL",
    "MAX_DIMS",
    "TARGET",
    "Builder",
    "Factory",
    "detect",
    "native",
    "native_dtype",
    "specialisations",
]

# ---------------------------------------------------------------------------------------
# the table: one line per op (its manifest's name -> a family's factory and what it fixes)

_TABLE: dict[str, Factory] = {
    "RMSNormFwdOp": rms_norm(HALVES),
    "FusedAddRMSNormFwdOp": fused_add_rms_norm(HALVES),
    "FusedAddLayerNormFwdOp": fused_add_layer_norm(FLOATS),
    "LayerNormFwdOp": layer_norm(FLOATS),
    "GroupNormFwdOp": group_norm(FLOATS),
    "SoftmaxFwdOp": softmax(log=False),
    "LogSoftmaxFwdOp": softmax(log=True),
    "SumFwdOp": reduction("sum"),
    "MeanFwdOp": reduction("mean"),
    "AmaxFwdOp": reduction("amax"),
    "GemmFwdOp": gemm(HALVES),
    "BmmFwdOp": bmm(HALVES, k_multiple=16),
    "AddFwdOp": binary("add"),
    "MulFwdOp": binary("mul"),
    "SiluFwdOp": activation("silu"),
    "GeluFwdOp": activation_by_approximate({"none": "gelu", "tanh": "gelu_tanh"}),
    "ReluFwdOp": activation("relu"),
    "SiluAndMulFwdOp": gated("silu"),
    "GeluTanhAndMulFwdOp": gated("gelu_tanh"),
    "GeluAndMulFwdOp": gated("gelu"),
    "ClampFwdOp": clamp(),
    "RopeNeoxFwdOp": rope(),
    "RopeNeoxPositionIdsFwdOp": rope_position_ids(),
    "RopeLlama31FwdOp": rope(scaling="llama31"),
    "RopeYarnFwdOp": rope(scaling="yarn"),
    "RopeLlama31PositionIdsFwdOp": rope_position_ids(scaling="llama31"),
    "RopeYarnPositionIdsFwdOp": rope_position_ids(scaling="yarn"),
    "RopeNonNeoxFwdOp": rope("pairs"),
    "RopeNonNeoxPositionIdsFwdOp": rope_position_ids("pairs"),
    "RopeLongRopeFwdOp": rope(scaling="longrope"),
    "RopeLongRopePositionIdsFwdOp": rope_position_ids(scaling="longrope"),
    "GroupedQueryAttentionFwdOp": attention(HALVES, form="prefill"),
    "GroupedQueryAttentionDecodeWithKVCacheFwdOp": attention(HALVES, form="decode"),
    "GroupedQueryAttentionPrefillFwdOp": attention(HALVES, form="varlen"),
    "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp": attention(HALVES, form="paged_prefill"),
    "GroupedQueryAttentionDecodePagedWithKVCacheFwdOp": attention(HALVES, form="paged_decode"),
    "GroupedQueryAttentionSlidingWindowFwdOp": attention(HALVES, form="prefill"),
    "GroupedQueryAttentionSlidingWindowVarlenFwdOp": attention(HALVES, form="varlen_window"),
    "FusedTopKOp": fused_topk(FLOATS),
    "FusedMoeFwdOp": fused_moe(HALVES),
    "GemmGgufFwdOp": gemm_gguf(FLOATS),
    "GemmW4A16FwdOp": gemm_w4a16(FLOATS),
    "EmbeddingGgufFwdOp": embedding_gguf(),
}


def _builder(op: str, factory: Factory) -> Builder:
    build = factory(op)
    build.__name__ = build.__qualname__ = f"BUILDERS[{op!r}]"  # what registry messages name
    return build


BUILDERS: dict[str, Builder] = {op: _builder(op, factory) for op, factory in _TABLE.items()}


def detect(device: torch.device) -> bool:
    return device.type == "cpu"


# The names tests and the benchmarks (benchmarks/native_cpu_cases.py) call builders by.
build_rms_norm = BUILDERS["RMSNormFwdOp"]
build_fused_add_rms_norm = BUILDERS["FusedAddRMSNormFwdOp"]
build_fused_add_layer_norm = BUILDERS["FusedAddLayerNormFwdOp"]
build_layer_norm = BUILDERS["LayerNormFwdOp"]
build_group_norm = BUILDERS["GroupNormFwdOp"]
build_softmax = BUILDERS["SoftmaxFwdOp"]
build_log_softmax = BUILDERS["LogSoftmaxFwdOp"]
build_sum = BUILDERS["SumFwdOp"]
build_mean = BUILDERS["MeanFwdOp"]
build_amax = BUILDERS["AmaxFwdOp"]
build_gemm = BUILDERS["GemmFwdOp"]
build_bmm = BUILDERS["BmmFwdOp"]
build_add = BUILDERS["AddFwdOp"]
build_mul = BUILDERS["MulFwdOp"]
build_silu = BUILDERS["SiluFwdOp"]
build_gelu = BUILDERS["GeluFwdOp"]
build_relu = BUILDERS["ReluFwdOp"]
build_silu_and_mul = BUILDERS["SiluAndMulFwdOp"]
build_clamp = BUILDERS["ClampFwdOp"]
build_rope_neox = BUILDERS["RopeNeoxFwdOp"]
build_rope_neox_position_ids = BUILDERS["RopeNeoxPositionIdsFwdOp"]
build_gqa = BUILDERS["GroupedQueryAttentionFwdOp"]
build_gqa_decode = BUILDERS["GroupedQueryAttentionDecodeWithKVCacheFwdOp"]
build_fused_topk = BUILDERS["FusedTopKOp"]
build_fused_moe = BUILDERS["FusedMoeFwdOp"]
build_gemm_gguf = BUILDERS["GemmGgufFwdOp"]
build_gemm_w4a16 = BUILDERS["GemmW4A16FwdOp"]
build_embedding_gguf = BUILDERS["EmbeddingGgufFwdOp"]
