"""tileops-backend-example: target ``torch_cpu``, every CPU device, kernels in PyTorch.

All registration happens here, at import. tileops imports this module through the
entry point in ``pyproject.toml`` when the first op is constructed; nobody imports it
by hand. Importing it compiles nothing: kernels are built when an op asks for one.

One builder per op, with that op's manifest signature (``src/tileops/manifest/*.yaml``):
the inputs arrive as ``TensorSpec``s (None for an optional input left out), the params as
resolved values. A builder checks what its kernel relies on (``checks.py``), fixes the
compile-time values and returns the kernel; the op set is what
``tileops.integrations.transformers`` needs to serve a whole Hugging Face model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tileops.backend import TensorSpec, register_detector, register_kernel_builder
from tileops.quant import ggml_blocks
from tileops.rope_tables import llama31_inv_freq, longrope_factor, longrope_inv_freq, plain_inv_freq

from .attention import CpuPagedPrefillAttention, CpuVarlenAttention
from .checks import (
    ALL_DTYPES,
    FLOATS,
    HALVES,
    TARGET,
    check_dtype,
    check_tensors,
    refuse,
    shape_of,
)
from .kernels import CpuAdd, CpuFusedAddRMSNorm, CpuGatedActivation, CpuGemm, CpuGemv, CpuRMSNorm
from .moe import CpuFusedMoe, CpuFusedTopK
from .pending import build_gemm_pending
from .quantized import CpuEmbeddingGguf, CpuGemmGguf, CpuGemmW4A16
from .rope import CpuRopePositionIds


def _detect(device: torch.device) -> bool:
    """One predicate over the device: every CPU belongs to this target."""
    return device.type == "cpu"


# ---- norms ---------------------------------------------------------------------------


def build_rms_norm(x: TensorSpec, weight: TensorSpec, *, normalized_shape: Sequence[int], eps: float):
    """RMSNormFwdOp. ``eps`` arrives resolved (1e-6 when the caller left it out)."""
    check_tensors("RMSNormFwdOp", HALVES, x=x, weight=weight)
    return CpuRMSNorm(normalized_shape, eps, x.dtype)


def build_fused_add_rms_norm(x: TensorSpec, residual: TensorSpec, weight: TensorSpec, *, eps: float = 1e-6):
    """FusedAddRMSNormFwdOp: returns (the norm of x + residual, x + residual)."""
    op = "FusedAddRMSNormFwdOp"
    check_tensors(op, HALVES, x=x, residual=residual, weight=weight)
    x_ = shape_of(x)
    if not (len(x_) >= 1 and shape_of(residual) == x_ and shape_of(weight) == x_[-1:]):
        got = f"x {shape_of(x)}, residual {shape_of(residual)}, weight {shape_of(weight)}"
        raise refuse(op, "x and residual [..., N], weight [N]", got)
    return CpuFusedAddRMSNorm(x.shape[-1], eps, x.dtype)


# ---- gemm ----------------------------------------------------------------------------


def build_gemm(a: TensorSpec, b: TensorSpec, *, trans_a: bool, trans_b: bool):
    """GemmFwdOp. The op's own split into gemm/gemv roles is not handed over: the
    builder reads M and N off the specs and picks a kernel itself."""
    check_tensors("GemmFwdOp", HALVES, a=a, b=b)
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    if m == 1:
        return CpuGemv("lhs_row", trans_a, trans_b, a.dtype)
    if n == 1:
        return CpuGemv("rhs_col", trans_a, trans_b, a.dtype)
    return CpuGemm(trans_a, trans_b, a.dtype)


# ---- elementwise ---------------------------------------------------------------------


def build_add(input: TensorSpec, other: TensorSpec, *, alpha: int | float = 1):  # noqa: A002
    """AddFwdOp: input + alpha * other, the two broadcast against each other."""
    op = "AddFwdOp"
    dtype = check_tensors(op, ALL_DTYPES, input=input, other=other)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise refuse(op, "alpha an int or a float", f"alpha={alpha!r}")
    if not (dtype.is_floating_point or isinstance(alpha, int)):
        raise refuse(op, f"an int alpha for {dtype} tensors", f"alpha={alpha!r}")
    try:
        torch.broadcast_shapes(shape_of(input), shape_of(other))
    except RuntimeError:
        got = f"{shape_of(input)} and {shape_of(other)}"
        raise refuse(op, "input and other shapes that broadcast", got) from None
    return CpuAdd(alpha, dtype)


def _gated(op: str, activation: str, x: TensorSpec) -> CpuGatedActivation:
    check_tensors(op, FLOATS, x=x)
    if not (len(x.shape) == 2 and x.shape[1] % 2 == 0):
        raise refuse(op, "x [M, 2N]: the gate, then the value", f"x of shape {shape_of(x)}")
    return CpuGatedActivation(activation, x.dtype)


def build_silu_and_mul(x: TensorSpec):
    """SiluAndMulFwdOp: silu(gate) * value."""
    return _gated("SiluAndMulFwdOp", "silu", x)


def build_gelu_tanh_and_mul(x: TensorSpec):
    """GeluTanhAndMulFwdOp: gelu with the tanh approximation (gate) * value."""
    return _gated("GeluTanhAndMulFwdOp", "gelu_tanh", x)


def build_gelu_and_mul(x: TensorSpec):
    """GeluAndMulFwdOp: exact gelu(gate) * value."""
    return _gated("GeluAndMulFwdOp", "gelu", x)


# ---- RoPE at explicit positions ------------------------------------------------------


def _rope_half(op: str, x: TensorSpec, position_ids: TensorSpec, max_position: int, rotary_dim: int) -> int:
    """Checks what the three RoPE ops share; returns the number of rotated pairs."""
    check_tensors(op, FLOATS, x=x)
    check_dtype(op, (torch.int32, torch.int64), position_ids=position_ids)
    if not (len(x.shape) == 3 and shape_of(position_ids) == shape_of(x)[:1]):
        got = f"x {shape_of(x)}, position_ids {shape_of(position_ids)}"
        raise refuse(op, "x [tokens, heads, head_dim] and position_ids [tokens]", got)
    if not (0 < rotary_dim <= x.shape[-1] and rotary_dim % 2 == 0 and max_position > 0):
        got = f"rotary_dim={rotary_dim}, head_dim={x.shape[-1]}, max_position={max_position}"
        raise refuse(op, "rotary_dim even and in (0, head_dim], max_position > 0", got)
    return rotary_dim // 2


def build_rope_neox_position_ids(
    x: TensorSpec,
    position_ids: TensorSpec,
    *,
    max_position: int,
    base: float = 10000.0,
    rotary_dim: int,
):
    """RopeNeoxPositionIdsFwdOp: the plain frequencies."""
    half = _rope_half("RopeNeoxPositionIdsFwdOp", x, position_ids, max_position, rotary_dim)
    return CpuRopePositionIds(plain_inv_freq(half, base), 1.0, rotary_dim, x.dtype)


def build_rope_llama31_position_ids(
    x: TensorSpec,
    position_ids: TensorSpec,
    *,
    max_position: int,
    base: float = 10000.0,
    rotary_dim: int,
    scale_factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position: int = 8192,
):
    """RopeLlama31PositionIdsFwdOp: Llama 3.1's frequencies."""
    op = "RopeLlama31PositionIdsFwdOp"
    half = _rope_half(op, x, position_ids, max_position, rotary_dim)
    scaling = dict(
        scale_factor=scale_factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position=original_max_position,
    )
    if not (base > 0 and scale_factor > 0 and original_max_position > 0):
        raise refuse(op, "base, scale_factor and original_max_position > 0", f"{scaling}")
    if not high_freq_factor > low_freq_factor > 0:
        raise refuse(op, "high_freq_factor > low_freq_factor > 0", f"{scaling}")
    inv_freq = llama31_inv_freq(half, base, **scaling)
    return CpuRopePositionIds(inv_freq, 1.0, rotary_dim, x.dtype)


def build_rope_longrope_position_ids(
    x: TensorSpec,
    position_ids: TensorSpec,
    *,
    max_position: int,
    base: float = 10000.0,
    rotary_dim: int,
    rescale_factors: Sequence[float] | None = None,
    max_position_embeddings: int = 4096,
    original_max_position_embeddings: int = 4096,
):
    """RopeLongRopePositionIdsFwdOp: per-frequency rescale factors (how the integration
    also serves linear and YaRN scaling), and LongRoPE's factor on cos and sin."""
    op = "RopeLongRopePositionIdsFwdOp"
    half = _rope_half(op, x, position_ids, max_position, rotary_dim)
    factors = [1.0] * half if rescale_factors is None else [float(f) for f in rescale_factors]
    if not (len(factors) == half and all(f > 0 for f in factors)):
        got = f"{len(factors)} values, smallest {min(factors, default=None)}"
        raise refuse(op, f"rescale_factors of {half} positive values, one per pair", got)
    if not (max_position_embeddings > 0 and original_max_position_embeddings > 0):
        got = f"{max_position_embeddings} and {original_max_position_embeddings}"
        raise refuse(op, "max_position_embeddings, original_max_position_embeddings > 0", got)
    factor = longrope_factor(max_position_embeddings, original_max_position_embeddings)
    inv_freq = longrope_inv_freq(half, base, rescale_factors=factors)
    return CpuRopePositionIds(inv_freq, factor, rotary_dim, x.dtype)


# ---- attention -----------------------------------------------------------------------


def _heads(op: str, q: TensorSpec, k: TensorSpec, v: TensorSpec) -> tuple[int, int, int]:
    """(H, H_kv, D) of q [rows, H, D] and k, v [rows, H_kv, D], H a multiple of H_kv."""
    q_, k_ = shape_of(q), shape_of(k)
    layout = len(q_) == 3 and len(k_) == 3 and shape_of(v) == k_ and k_[2] == q_[2]
    if not (layout and k_[1] > 0 and q_[1] % k_[1] == 0):
        got = f"q {q_}, k {k_}, v {shape_of(v)}"
        raise refuse(op, "q [rows, H, D], k and v [rows, H_kv, D], H a multiple of H_kv", got)
    return q_[1], k_[1], q_[2]


def _scores(op: str, sm_scale: float | None, softcap: float | None, left: int, right: int = -1) -> dict:
    """The kernel's score and left-window settings, checked."""
    if not ((sm_scale is None or sm_scale > 0) and (softcap is None or softcap >= 0)):
        raise refuse(op, "sm_scale > 0 and softcap >= 0", f"{sm_scale=}, {softcap=}")
    if not (left >= -1 and right >= -1):
        raise refuse(op, "windows of -1 (off) or >= 0", f"left={left}, right={right}")
    return dict(sm_scale=sm_scale, softcap=softcap, window_left=left)


def build_gqa_prefill(
    q: TensorSpec,
    k: TensorSpec,
    v: TensorSpec,
    cu_seqlens_q: TensorSpec,
    cu_seqlens_kv: TensorSpec,
    q_scale: TensorSpec | None = None,
    k_scale: TensorSpec | None = None,
    v_scale: TensorSpec | None = None,
    *,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = True,
    sm_scale: float | None = None,
    softcap: float | None = None,
    window_size_left: int = -1,
    window_size_right: int = -1,
):
    """GroupedQueryAttentionPrefillFwdOp: packed requests of different lengths. The fp8
    descales are accepted and ignored: 16-bit inputs carry no scale."""
    op = "GroupedQueryAttentionPrefillFwdOp"
    dtype = check_tensors(op, HALVES, q=q, k=k, v=v)
    check_dtype(op, (torch.int32,), cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv)
    check_dtype(op, (torch.float32,), q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
    heads, heads_kv, dim = _heads(op, q, k, v)
    cu_q, cu_kv = shape_of(cu_seqlens_q), shape_of(cu_seqlens_kv)
    if not (len(cu_q) == 1 and cu_q[0] >= 2 and cu_kv == cu_q):
        raise refuse(op, "cu_seqlens_q and cu_seqlens_kv [B+1], B >= 1", f"{cu_q} and {cu_kv}")
    scores = _scores(op, sm_scale, softcap, window_size_left, window_size_right)
    return CpuVarlenAttention(
        heads,
        heads_kv,
        dim,
        causal=is_causal,
        window_right=window_size_right,
        dtype=dtype,
        **scores,
    )


def build_gqa_prefill_paged(
    q: TensorSpec,
    k_new: TensorSpec,
    v_new: TensorSpec,
    k_pages: TensorSpec,
    v_pages: TensorSpec,
    k_scale: TensorSpec | None,
    v_scale: TensorSpec | None,
    cu_seqlens_q: TensorSpec,
    cache_seqlens: TensorSpec,
    block_table: TensorSpec,
    *,
    max_pages_per_req: int,
    page_size: int,
    max_seqlen_q: int,
    is_causal: bool = True,
    sm_scale: float | None = None,
    softcap: float | None = None,
    window_size_left: int = -1,
):
    """GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp: appends each request's chunk to
    the paged pools (in place), then attends over its cache. The fp8 scales are accepted
    and ignored: 16-bit pools carry no scale."""
    op = "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp"
    pools = dict(k_pages=k_pages, v_pages=v_pages)
    dtype = check_tensors(op, HALVES, q=q, k_new=k_new, v_new=v_new, **pools)
    tables = dict(cu_seqlens_q=cu_seqlens_q, cache_seqlens=cache_seqlens, block_table=block_table)
    check_dtype(op, (torch.int32,), **tables)
    check_dtype(op, (torch.float32,), k_scale=k_scale, v_scale=v_scale)
    heads, heads_kv, dim = _heads(op, q, k_new, v_new)
    pages = shape_of(k_pages)
    if not (
        shape_of(k_new)[0] == shape_of(q)[0]
        and page_size > 0
        and len(pages) == 3
        and pages[0] % page_size == 0
        and pages[1:] == (heads_kv, dim)
        and shape_of(v_pages) == pages
    ):
        got = f"q {shape_of(q)}, k_new {shape_of(k_new)}, k_pages {pages}, {page_size=}"
        want = f"k_new [rows of q, {heads_kv}, {dim}], pools [pages * page_size, {heads_kv}, {dim}]"
        raise refuse(op, want, got)
    batch = shape_of(cu_seqlens_q)[0] - 1 if len(cu_seqlens_q.shape) == 1 else 0
    if not (batch >= 1 and shape_of(cache_seqlens) == (batch,) and shape_of(block_table) == (batch, max_pages_per_req)):
        got = ", ".join(f"{name} {shape_of(spec)}" for name, spec in tables.items())
        want = "cu_seqlens_q [B+1], cache_seqlens [B], block_table [B, max_pages_per_req]"
        raise refuse(op, want, f"{got}, {max_pages_per_req=}")
    scores = _scores(op, sm_scale, softcap, window_size_left)
    return CpuPagedPrefillAttention(heads, heads_kv, dim, page_size=page_size, causal=is_causal, dtype=dtype, **scores)


# ---- mixture of experts --------------------------------------------------------------


def _routing(op: str, experts: int, top_k: int | None, scoring_func: str, bias: TensorSpec | None) -> None:
    """What both MoE ops' routing needs."""
    if not (isinstance(top_k, int) and 1 <= top_k <= experts):
        raise refuse(op, f"top_k an int in [1, {experts}] (the experts)", f"top_k={top_k!r}")
    if scoring_func not in ("softmax", "sigmoid"):
        raise refuse(op, "scoring_func 'softmax' or 'sigmoid'", f"{scoring_func=}")
    if bias is not None:
        check_dtype(op, (torch.float32,), correction_bias=bias)
        if not (scoring_func == "sigmoid" and shape_of(bias) == (experts,)):
            got = f"correction_bias {shape_of(bias)}, {scoring_func=}"
            raise refuse(op, f"correction_bias [{experts}] with scoring_func='sigmoid'", got)


def build_fused_topk(
    gating_output: TensorSpec,
    correction_bias: TensorSpec | None = None,
    *,
    num_tokens: int | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
    scoring_func: str = "softmax",
    renormalize: bool = False,
):
    """FusedTopKOp: the router. The token count is read per call (at most num_tokens)."""
    op = "FusedTopKOp"
    dtype = check_tensors(op, FLOATS, gating_output=gating_output)
    logits = shape_of(gating_output)
    fits = len(logits) == 2 and (num_tokens is None or logits[0] <= num_tokens)
    if not (fits and num_experts in (None, logits[1])):
        got = f"gating_output {logits}, {num_tokens=}, {num_experts=}"
        raise refuse(op, "gating_output [tokens <= num_tokens, num_experts]", got)
    _routing(op, logits[1], top_k, scoring_func, correction_bias)
    return CpuFusedTopK(top_k, scoring_func, renormalize, dtype)


def build_fused_moe(
    hidden_states: TensorSpec,
    gating_output: TensorSpec,
    w_gate_up: TensorSpec,
    w_down: TensorSpec,
    correction_bias: TensorSpec | None = None,
    *,
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden_size: int,
    ffn_size: int,
    scoring_func: str = "softmax",
    renormalize: bool = False,
    routed_scaling_factor: float = 1.0,
    activation: str = "silu_and_mul",
):
    """FusedMoeFwdOp: routing, the chosen experts and their weighted sum in one kernel."""
    op = "FusedMoeFwdOp"
    weights = dict(w_gate_up=w_gate_up, w_down=w_down)
    dtype = check_tensors(op, HALVES, hidden_states=hidden_states, **weights)
    check_dtype(op, (torch.float32,), gating_output=gating_output)
    t = shape_of(hidden_states)[0] if len(hidden_states.shape) == 2 else -1  # -1: refused below
    e, h, f = num_experts, hidden_size, ffn_size
    given = dict(hidden_states=hidden_states, gating_output=gating_output, **weights)
    expected = dict(hidden_states=(t, h), gating_output=(t, e), w_gate_up=(e, 2 * f, h), w_down=(e, h, f))
    if not (t <= num_tokens and all(shape_of(given[n]) == s for n, s in expected.items())):
        got = ", ".join(f"{name} {shape_of(spec)}" for name, spec in given.items())
        raise refuse(op, f"T <= num_tokens={num_tokens} and shapes {expected}", got)
    _routing(op, e, top_k, scoring_func, correction_bias)
    if activation not in CpuFusedMoe.ACTIVATIONS:
        raise refuse(op, f"activation in {sorted(CpuFusedMoe.ACTIVATIONS)}", f"{activation=}")
    return CpuFusedMoe(
        top_k=top_k,
        ffn_size=f,
        scoring_func=scoring_func,
        renormalize=renormalize,
        routed_scaling_factor=routed_scaling_factor,
        activation=activation,
        dtype=dtype,
    )


# ---- registration --------------------------------------------------------------------

# ---- quantized weights ---------------------------------------------------------------


def _ggml(op: str, ggml_type: str) -> ggml_blocks.GgmlType:
    try:
        return ggml_blocks.ggml_type(ggml_type)
    except ValueError as error:
        raise refuse(op, "a GGML type tileops serves", repr(ggml_type), str(error)) from None


def build_gemm_gguf(activation: TensorSpec, weight: TensorSpec, *, ggml_type: str):
    """GemmGgufFwdOp: the weight's rows of GGML blocks dequantized at each call."""
    op = "GemmGgufFwdOp"
    dtype = check_tensors(op, FLOATS, activation=activation)
    check_dtype(op, (torch.uint8,), weight=weight)
    t = _ggml(op, ggml_type)
    k, row = shape_of(activation)[-1], shape_of(weight)[-1]
    if k % t.block_size or row != k // t.block_size * t.type_size:
        raise refuse(
            op,
            f"weight rows of {k // t.block_size} {t.name} blocks ({k // t.block_size * t.type_size} bytes)",
            f"K={k} and rows of {row} bytes",
        )
    return CpuGemmGguf(t.name, dtype)


def build_gemm_w4a16(
    activation: TensorSpec,
    packed_weight: TensorSpec,
    weight_scale: TensorSpec,
    weight_zero: TensorSpec,
    *,
    group_size: int,
):
    """GemmW4A16FwdOp: the 4-bit groups dequantized at each call."""
    op = "GemmW4A16FwdOp"
    dtype = check_tensors(op, FLOATS, activation=activation)
    check_dtype(op, (torch.uint8,), packed_weight=packed_weight, weight_zero=weight_zero)
    check_dtype(op, (torch.float32, torch.float16), weight_scale=weight_scale)
    return CpuGemmW4A16(group_size, dtype)


def build_embedding_gguf(ids: TensorSpec, weight: TensorSpec, *, ggml_type: str, out_dtype: str):
    """EmbeddingGgufFwdOp: the rows asked for, dequantized."""
    op = "EmbeddingGgufFwdOp"
    check_dtype(op, (torch.int32, torch.int64), ids=ids)
    check_dtype(op, (torch.uint8,), weight=weight)
    t = _ggml(op, ggml_type)
    if shape_of(weight)[-1] % t.type_size:
        raise refuse(
            op,
            f"weight rows of whole {t.name} blocks ({t.type_size} bytes each)",
            f"rows of {shape_of(weight)[-1]} bytes",
        )
    return CpuEmbeddingGguf(t.name, getattr(torch, out_dtype))


BUILDERS = {
    "RMSNormFwdOp": build_rms_norm,
    "FusedAddRMSNormFwdOp": build_fused_add_rms_norm,
    "GemmFwdOp": build_gemm,
    "AddFwdOp": build_add,
    "SiluAndMulFwdOp": build_silu_and_mul,
    "GeluTanhAndMulFwdOp": build_gelu_tanh_and_mul,
    "GeluAndMulFwdOp": build_gelu_and_mul,
    "RopeNeoxPositionIdsFwdOp": build_rope_neox_position_ids,
    "RopeLlama31PositionIdsFwdOp": build_rope_llama31_position_ids,
    "RopeLongRopePositionIdsFwdOp": build_rope_longrope_position_ids,
    "GroupedQueryAttentionPrefillFwdOp": build_gqa_prefill,
    "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp": build_gqa_prefill_paged,
    "FusedTopKOp": build_fused_topk,
    "FusedMoeFwdOp": build_fused_moe,
    "GemmGgufFwdOp": build_gemm_gguf,
    "GemmW4A16FwdOp": build_gemm_w4a16,
    "EmbeddingGgufFwdOp": build_embedding_gguf,
}

register_detector(target=TARGET, detect=_detect)
for _op, _build in BUILDERS.items():
    register_kernel_builder(op=_op, target=TARGET, build_kernel=_build)
# Registered under a name no manifest declares: never called (see pending.py).
register_kernel_builder(op="GemmOp", target=TARGET, build_kernel=build_gemm_pending)
