"""References of the ops over quantized weights: the weights dequantized exactly (the GGML
block formats: ``tileops.quant.ggml_blocks``; 4-bit groups: ``tileops.quant.int4``), then
the product in float32, rounded once to the activation's dtype."""

from __future__ import annotations

import torch

from ._reference_base import Tensor, _down, _up


def _gemm_gguf(activation: Tensor, weight: Tensor, *, ggml_type: str) -> Tensor:
    from tileops.quant import ggml_blocks  # noqa: PLC0415 - the quantized formats load with their ops

    w = ggml_blocks.dequantize(weight, ggml_type)  # float32 [N, K]
    return _down(_up(activation).to(torch.float32) @ w.t(), activation)


def _embedding_gguf(ids: Tensor, weight: Tensor, *, ggml_type: str, out_dtype: str) -> Tensor:
    from tileops.quant import ggml_blocks  # noqa: PLC0415

    rows = ggml_blocks.dequantize(weight[ids.long()], ggml_type)
    return rows.to(getattr(torch, out_dtype))


def _gemm_w4a16(
    activation: Tensor, packed_weight: Tensor, weight_scale: Tensor, weight_zero: Tensor, *, group_size: int
) -> Tensor:
    from tileops.quant import int4  # noqa: PLC0415

    w = int4.dequantize(packed_weight, weight_scale, weight_zero, group_size)
    return _down(_up(activation).to(torch.float32) @ w.t(), activation)


WRITTEN_OUT = {
    "GemmGgufFwdOp": lambda: _gemm_gguf,
    "EmbeddingGgufFwdOp": lambda: _embedding_gguf,
    "GemmW4A16FwdOp": lambda: _gemm_w4a16,
}

# A kernel over quantized weights may round the activation too (to 8-bit blocks, as
# llama.cpp's CPU path does before its integer dot products): errors of about 1/256 of
# each block's largest activation, summed over K, whatever the output's dtype. On the
# harness's inputs (weights of about 0.02, activations of about 1) that is a few hundredths
# at most over a row of thousands of outputs.
_ACTIVATION_ROUNDED = {torch.float32: (3e-2, 3e-2), torch.float16: (3e-2, 3e-2), torch.bfloat16: (3e-2, 3e-2)}
TOLERANCES = {"GemmGgufFwdOp": _ACTIVATION_ROUNDED, "GemmW4A16FwdOp": _ACTIVATION_ROUNDED}
