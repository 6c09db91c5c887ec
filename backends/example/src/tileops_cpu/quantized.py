"""Kernels over quantized weights: GemmGgufFwdOp, GemmW4A16FwdOp, EmbeddingGgufFwdOp.

The weights stay in their blocks: each call dequantizes them (``tileops.quant``, the formats
every target is checked against) and multiplies in float32. A real backend reads the
blocks in its GEMM's inner loop instead, with integer dot products where the hardware has
them; this is what such a kernel must compute.
"""

from __future__ import annotations

import torch

from tileops.quant import ggml_blocks, int4


class CpuGemmGguf:
    """activation [M, K] @ W.T, W given as GGUF rows of GGML blocks (``ggml_type``)."""

    def __init__(self, ggml_type: str, dtype: torch.dtype) -> None:
        self.ggml_type, self.dtype = ggml_type, dtype

    @torch.no_grad()
    def __call__(self, activation: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        w = ggml_blocks.dequantize(weight, self.ggml_type)
        return (activation.to(torch.float32) @ w.t()).to(self.dtype)


class CpuGemmW4A16:
    """activation [M, K] @ W.T, W 4-bit in groups of ``group_size`` (upstream's layout)."""

    def __init__(self, group_size: int, dtype: torch.dtype) -> None:
        self.group_size, self.dtype = group_size, dtype

    @torch.no_grad()
    def __call__(
        self,
        activation: torch.Tensor,
        packed_weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_zero: torch.Tensor,
    ) -> torch.Tensor:
        w = int4.dequantize(packed_weight, weight_scale, weight_zero, self.group_size)
        return (activation.to(torch.float32) @ w.t()).to(self.dtype)


class CpuEmbeddingGguf:
    """Rows ``ids`` of an embedding table given as GGUF rows of GGML blocks, dequantized."""

    def __init__(self, ggml_type: str, out_dtype: torch.dtype) -> None:
        self.ggml_type, self.out_dtype = ggml_type, out_dtype

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return ggml_blocks.dequantize(weight[ids.long()], self.ggml_type).to(self.out_dtype)
