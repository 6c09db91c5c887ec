"""roofline: each workload's flops and bytes, as the manifests' tables give them."""

from __future__ import annotations

import torch

from tileops import manifest

from ._common import BF16, F16, F32, specs, workload


def _roof(op: str, name: str, dtype: torch.dtype, **override: object) -> tuple[int, int]:
    e = manifest.entry(op)
    shapes, params = workload(e, name, dtype)
    params = e.init_params({**params, **override})
    return e.roofline(specs(e, shapes, dtype), params)


def test_roofline_of_norm_workloads_follows_the_table() -> None:
    M, N = 2048, 4096
    assert _roof("RMSNormFwdOp", "llama-8b-prefill", F16) == (4 * M * N, (2 * M * N + N) * 2)
    assert _roof("FusedAddRMSNormFwdOp", "llama-8b-prefill", BF16) == (
        5 * M * N,
        (4 * M * N + N) * 2,
    )
    assert _roof("LayerNormFwdOp", "llama-8b-prefill", F16) == (5 * M * N, (2 * M * N + 2 * N) * 2)
    n, c, s = 8, 128, 32 * 32
    assert _roof("GroupNormFwdOp", "image-g32-affine", F16) == (
        5 * n * c * s,
        (2 * n * c * s + 2 * c) * 2,
    )
    assert _roof("GroupNormFwdOp", "image-g32", BF16) == (3 * n * c * s, 2 * n * c * s * 2)


def test_roofline_of_reductions_follows_the_table() -> None:
    M, N = 32 * 32, 4096
    assert _roof("SoftmaxFwdOp", "attn-weights-4k", F32) == (5 * M * N, 2 * M * N * 4)
    assert _roof("LogSoftmaxFwdOp", "attn-weights-4k", F16, dim=None) == (  # legacy: dim 0
        5 * 32 * 32 * 4096,
        2 * 32 * 32 * 4096 * 2,
    )
    M, N = 128, 4 * 4096
    assert _roof("SumFwdOp", "batch-and-hidden", F16) == (M * N, (M * N + M) * 2)
    assert _roof("MeanFwdOp", "batch-and-hidden", F16) == (M * (N + 1), (M * N + M) * 2)
    assert _roof("AmaxFwdOp", "hidden-all", BF16) == (2048 * 4096, (2048 * 4096 + 1) * 2)


def test_roofline_of_gemm_and_bmm_workloads_follows_the_table() -> None:
    m, n, k = 4096, 4096, 7168
    assert _roof("GemmFwdOp", "ds-v3-prefill-attn-proj", BF16) == (
        2 * m * n * k,
        (m * k + n * k + m * n) * 2,
    )
    m, n, k = 128, 2112, 7168
    assert _roof("GemmFwdOp", "ds-v3-decode-gate-up", BF16) == (
        2 * m * n * k,
        (m * k + n * k + m * n) * 2,
    )
    b, m, n, k = 64, 128, 2048, 128
    assert _roof("BmmFwdOp", "mha-decode-qk", F16) == (
        2 * b * m * n * k,
        b * (m * k + n * k + m * n) * 2,
    )


def test_roofline_of_elementwise_workloads_follows_the_table() -> None:
    total = 16 * 256 * 56 * 56
    assert _roof("AddFwdOp", "conv-bias-broadcast", F16) == (
        2 * total,
        (total + 256) * 2 + total * 2,
    )
    assert _roof("MulFwdOp", "conv-bias-broadcast", BF16) == (total, (total + 256 + total) * 2)
    n = 4096 * 4096
    assert _roof("ClampFwdOp", "square-4k-min-only", F32) == (n, 3 * n * 4)
    assert _roof("ClampFwdOp", "square-4k-both", F16) == (n, 4 * n * 2)
    n = 2048 * 14336
    assert _roof("SiluFwdOp", "llama-8b-mlp-prefill", F16) == (5 * n, 2 * n * 2)
    assert _roof("GeluFwdOp", "llama-8b-mlp-prefill", F16) == (5 * n, 2 * n * 2)
    assert _roof("ReluFwdOp", "hidden-prefill", F16) == (2048 * 4096, 2 * 2048 * 4096 * 2)
    M, N = 2048, 14336
    assert _roof("SiluAndMulFwdOp", "llama-8b-mlp-prefill", BF16) == (6 * M * N, 3 * M * N * 2)


def test_roofline_of_rope_and_attention_workloads_follows_the_table() -> None:
    x = 2 * 32 * 2048 * 128
    assert _roof("RopeNeoxFwdOp", "b2-seq2k-h32-d128-2d", F16) == (
        4 * x,
        (2 * x + 2048 * 64 * 2) * 2,
    )
    x = 4096 * 128
    assert _roof("RopeNeoxFwdOp", "seq4k-d128-1d", BF16) == (4 * x, (2 * x + 4096 * 64 * 2) * 2)
    B, S, H, D, Hkv = 4, 512, 32, 128, 8
    flops = 4 * B * H * S * S * D
    nbytes = 2 * (B * S * H * D + B * S * Hkv * D) * 2
    assert _roof("GroupedQueryAttentionFwdOp", "llama-8b-short", F16) == (flops // 2, nbytes)
    assert _roof("GroupedQueryAttentionFwdOp", "llama-8b-short", F16, is_causal=False) == (
        flops,
        nbytes,
    )
    B, H, D, N, Hkv = 32, 32, 128, 4096, 8
    assert _roof("GroupedQueryAttentionDecodeWithKVCacheFwdOp", "llama-8b-4k", BF16) == (
        4 * B * H * N * D,
        (2 * B * H * D + 2 * B * N * Hkv * D) * 2,
    )
