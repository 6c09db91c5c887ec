"""Reference implementations of every manifest op, for numeric tests of any target.

``reference(op)(*inputs, **call_params)`` takes the op's input tensors positionally (None
for an absent optional input) and the params as ``OpEntry.call_params`` gives them, and
returns what the op returns: one tensor, or a tuple in ``signature.outputs`` order.
Low-precision floats are computed in float32 and cast back to the input's dtype, so the
reference is at least as accurate as any kernel it judges.

Where the manifest names a ``ref_api``, the reference calls that function: as
``api(*inputs, **params)`` unless its calling convention differs from the manifest's
(``_ADAPTERS``, keyed by the API). An op with ``ref_api: none`` has its math written out
here once (``_WRITTEN_OUT``, keyed by op name). A new op whose torch function takes the
manifest's inputs and params as they are needs nothing here.

The attention references are in ``_reference_attention``; what all references share
(float32 compute, ``in_input_dtype``) in ``_reference_base``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tileops import manifest
from tileops.rope_tables import cos_sin

from ._reference_attention import (
    _gqa_decode,
    _gqa_fwd,
    _paged_decode,
    _paged_prefill,
    _sliding_window,
    _sliding_window_varlen,
    _varlen_prefill,
)
from ._reference_base import RefResult, Tensor, _down, _up, in_input_dtype
from ._reference_quantized import TOLERANCES as _QUANTIZED_TOLERANCES
from ._reference_quantized import WRITTEN_OUT as _QUANTIZED

__all__ = ["in_input_dtype", "reference", "route_tokens", "tolerance"]

# (rtol, atol). fp16/bf16 outputs are rounded once (bf16 has 8 mantissa bits, fp16 11);
# kernels accumulate in float32 but in their own order, hence the slack over one ulp.
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def tolerance(dtype: torch.dtype, op: str | None = None) -> tuple[float, float]:
    """(rtol, atol) for comparing an op's output of ``dtype`` with its reference (``op``'s
    own where its kernels may round more than the output's dtype does).
    Integer and bool results must match exactly."""
    if op in _QUANTIZED_TOLERANCES and dtype in _QUANTIZED_TOLERANCES[op]:
        return _QUANTIZED_TOLERANCES[op][dtype]
    if dtype in _TOLERANCES:
        return _TOLERANCES[dtype]
    if dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"no tolerance defined for {dtype}")
    return (0.0, 0.0)


def _api(path: str | None) -> Callable[..., Any]:
    assert path is not None and path.startswith("torch.")
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


# --- RoPE rotations (their cos/sin tables: tileops.rope_tables) -----------------------


def _rotate_neox(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """NeoX half-split rotation of the last dim of ``x`` (float32); cos/sin broadcast to
    ``x[..., :half]``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Adjacent-pair rotation of the last dim of ``x`` (float32): channels 2k and 2k+1
    rotate by angle k; cos/sin broadcast to ``x[..., ::2]``."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


# --- references -----------------------------------------------------------------------


def _rms_norm(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    def ref(x: Tensor, weight: Tensor, *, normalized_shape: tuple[int, ...], eps: float) -> Tensor:
        return _down(fn(_up(x), list(normalized_shape), _up(weight), eps), x)

    return ref


def _fused_add_rms_norm() -> Callable[..., RefResult]:
    def ref(x: Tensor, residual: Tensor, weight: Tensor, *, eps: float) -> tuple[Tensor, Tensor]:
        # r stays float32 for the normalisation; residual_out is r rounded once.
        r = _up(x) + _up(residual)  # type: ignore[operator]
        out = r * torch.rsqrt(r.pow(2).mean(dim=-1, keepdim=True) + eps) * _up(weight)
        return _down(out, x), _down(r, x)

    return ref


def _fused_add_layer_norm() -> Callable[..., RefResult]:
    def ref(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, *, eps: float) -> tuple[Tensor, Tensor]:
        # as _fused_add_rms_norm: r in float32 for the norm, residual_out is r rounded once
        r = _up(x) + _up(residual)  # type: ignore[operator]
        out = F.layer_norm(r, [r.shape[-1]], _up(weight), _up(bias), eps)
        return _down(out, x), _down(r, x)

    return ref


def _layer_norm(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    def ref(x: Tensor, weight: Tensor, bias: Tensor, *, normalized_shape: tuple[int, ...], eps: float) -> Tensor:
        return _down(fn(_up(x), list(normalized_shape), _up(weight), _up(bias), eps), x)

    return ref


def _group_norm(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    def ref(x: Tensor, weight: Tensor | None, bias: Tensor | None, *, num_groups: int, eps: float) -> Tensor:
        return _down(fn(_up(x), num_groups, _up(weight), _up(bias), eps), x)

    return ref


def _gemm(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    def ref(a: Tensor, b: Tensor, *, trans_a: bool, trans_b: bool) -> Tensor:
        lhs, rhs = _up(a), _up(b)
        assert lhs is not None and rhs is not None
        return _down(fn(lhs.T if trans_a else lhs, rhs.T if trans_b else rhs), a)

    return ref


def _inplace_activation(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    def ref(input: Tensor, *, inplace: bool) -> Tensor:
        out = _down(fn(_up(input)), input)
        if inplace:  # the op writes its input and returns it
            input.copy_(out)
            return input
        return out

    return ref


def _gated(activation: Callable[[Tensor], Tensor]) -> Callable[..., RefResult]:
    """activation(gate) * value, where x [M, 2N] = [gate | value]."""

    def ref(x: Tensor) -> Tensor:
        gate, value = _up(x).chunk(2, dim=-1)  # type: ignore[union-attr]
        return _down(activation(gate) * value, x)

    return ref


def _rope_neox(scaling: str | None = None, rotate: Callable[..., Tensor] = _rotate_neox) -> Callable[..., RefResult]:
    """NeoX rotation (or ``rotate``) at positions 0..S-1, plain or with the frequencies of
    ``scaling`` (a tileops.rope_tables.SCALINGS name)."""

    def ref(x: Tensor, *, layout: str, base: float, **params: Any) -> Tensor:
        seq_len = x.shape[1] if layout == "2d" else x.shape[0]
        positions = torch.arange(seq_len, device=x.device)
        cos, sin = cos_sin(positions, x.shape[-1], base, x.dtype, scaling, params)
        if layout == "2d":  # [S, D/2] -> [S, 1, D/2] against x [B, S, H, D]
            cos, sin = cos[:, None, :], sin[:, None, :]
        return _down(rotate(_up(x), _up(cos), _up(sin)), x)  # type: ignore[arg-type]

    return ref


def _rope_neox_position_ids(
    scaling: str | None = None, rotate: Callable[..., Tensor] = _rotate_neox
) -> Callable[..., RefResult]:
    """NeoX rotation (or ``rotate``) at explicit positions, plain or with a scaling's frequencies."""

    def ref(
        x: Tensor, position_ids: Tensor, *, max_position: int, base: float, rotary_dim: int, **params: Any
    ) -> Tensor:
        if position_ids.numel() and (int(position_ids.min()) < 0 or int(position_ids.max()) >= max_position):
            raise ValueError(
                f"position_ids must lie in [0, {max_position}), got "
                f"[{int(position_ids.min())}, {int(position_ids.max())}]"
            )
        # Rows of the [max_position, rotary_dim/2] table, computed only where needed.
        cos, sin = cos_sin(position_ids, rotary_dim, base, x.dtype, scaling, params)
        xf = _up(x)
        assert xf is not None
        rotated = rotate(xf[..., :rotary_dim], _up(cos)[:, None, :], _up(sin)[:, None, :])  # type: ignore[index]
        return _down(torch.cat((rotated, xf[..., rotary_dim:]), dim=-1), x)

    return ref


def route_tokens(
    gating_output: Tensor, correction_bias: Tensor | None, *, top_k: int, scoring_func: str, renormalize: bool
) -> tuple[Tensor, Tensor]:
    """The MoE routing rule (src/tileops/manifest/moe.yaml): (weights float32 [T, K], ids
    int64 [T, K]), largest selection value first, a tie going to the lower expert id.

    Scores are softmax (over the experts, in float32) or sigmoid of the logits. Selection
    is on the logits themselves where no bias is given (both scores are monotonic in
    them, so the experts are the same, and equal logits are the only ties), else on
    sigmoid + bias; the weights are the unbiased scores."""
    logits = gating_output.float()
    scores = logits.softmax(dim=-1) if scoring_func == "softmax" else logits.sigmoid()
    select = logits if correction_bias is None else scores + correction_bias.float()
    # a stable sort keeps equal values in index order: ties go to the lower id
    ids = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _fused_topk() -> Callable[..., RefResult]:
    def ref(
        gating_output: Tensor,
        correction_bias: Tensor | None,
        *,
        top_k: int,
        scoring_func: str,
        renormalize: bool,
        **_sizes: Any,
    ) -> tuple[Tensor, Tensor]:
        weights, ids = route_tokens(
            gating_output, correction_bias, top_k=top_k, scoring_func=scoring_func, renormalize=renormalize
        )
        return weights, ids.to(torch.int32)

    return ref


_MOE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"silu_and_mul": F.silu, "gelu_and_mul": F.gelu}


def _fused_moe() -> Callable[..., RefResult]:
    """An eager loop over the experts, all in float32, rounded once. Each expert runs on
    every token and is weighted by what each token gives it (0 where it was not chosen):
    no data-dependent indexing, so the same code runs on meta tensors."""

    def ref(
        hidden_states: Tensor,
        gating_output: Tensor,
        w_gate_up: Tensor,
        w_down: Tensor,
        correction_bias: Tensor | None,
        *,
        top_k: int,
        ffn_size: int,
        scoring_func: str,
        renormalize: bool,
        routed_scaling_factor: float,
        activation: str,
        **_sizes: Any,
    ) -> Tensor:
        weights, ids = route_tokens(
            gating_output, correction_bias, top_k=top_k, scoring_func=scoring_func, renormalize=renormalize
        )
        act = _MOE_ACTIVATIONS[activation]
        x = _up(hidden_states)
        assert x is not None
        out = torch.zeros_like(x)
        for expert in range(w_gate_up.shape[0]):
            share = (weights * (ids == expert)).sum(dim=-1, keepdim=True)  # [T, 1]
            gate_up = x @ _up(w_gate_up[expert]).T  # type: ignore[union-attr]
            h = act(gate_up[:, :ffn_size]) * gate_up[:, ffn_size:]
            out = out + share * (h @ _up(w_down[expert]).T)  # type: ignore[union-attr]
        return _down(out * routed_scaling_factor, hidden_states)

    return ref


def _api_call(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    """The default: inputs positionally, the manifest params by name, in float32."""

    def ref(*inputs: Tensor | None, **params: Any) -> Tensor:
        return _down(fn(*(_up(t) for t in inputs), **params), inputs[0])  # type: ignore[arg-type]

    return ref


# ref_api -> how to call it, where the manifest's inputs and params are not its own.
_ADAPTERS: dict[str, Callable[[Callable[..., Tensor]], Callable[..., RefResult]]] = {
    "torch.nn.functional.rms_norm": _rms_norm,
    "torch.nn.functional.layer_norm": _layer_norm,
    "torch.nn.functional.group_norm": _group_norm,
    "torch.matmul": _gemm,
    "torch.nn.functional.silu": _inplace_activation,
    "torch.nn.functional.relu": _inplace_activation,
    "torch.nn.functional.scaled_dot_product_attention": _gqa_fwd,
}

# op -> its math, for the entries whose ref_api is none.
_WRITTEN_OUT: dict[str, Callable[[], Callable[..., RefResult]]] = {
    **_QUANTIZED,
    "FusedAddRMSNormFwdOp": _fused_add_rms_norm,
    "FusedAddLayerNormFwdOp": _fused_add_layer_norm,
    "SiluAndMulFwdOp": lambda: _gated(F.silu),
    "GeluTanhAndMulFwdOp": lambda: _gated(lambda gate: F.gelu(gate, approximate="tanh")),
    "GeluAndMulFwdOp": lambda: _gated(F.gelu),
    "RopeNeoxFwdOp": _rope_neox,
    "RopeNeoxPositionIdsFwdOp": _rope_neox_position_ids,
    "RopeLlama31FwdOp": lambda: _rope_neox("llama31"),
    "RopeYarnFwdOp": lambda: _rope_neox("yarn"),
    "RopeLlama31PositionIdsFwdOp": lambda: _rope_neox_position_ids("llama31"),
    "RopeYarnPositionIdsFwdOp": lambda: _rope_neox_position_ids("yarn"),
    "RopeNonNeoxFwdOp": lambda: _rope_neox(rotate=_rotate_pairs),
    "RopeNonNeoxPositionIdsFwdOp": lambda: _rope_neox_position_ids(rotate=_rotate_pairs),
    "RopeLongRopeFwdOp": lambda: _rope_neox("longrope"),
    "RopeLongRopePositionIdsFwdOp": lambda: _rope_neox_position_ids("longrope"),
    "GroupedQueryAttentionDecodeWithKVCacheFwdOp": _gqa_decode,
    "GroupedQueryAttentionPrefillFwdOp": _varlen_prefill,
    "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp": _paged_prefill,
    "GroupedQueryAttentionDecodePagedWithKVCacheFwdOp": _paged_decode,
    "GroupedQueryAttentionSlidingWindowFwdOp": _sliding_window,
    "GroupedQueryAttentionSlidingWindowVarlenFwdOp": _sliding_window_varlen,
    "FusedTopKOp": _fused_topk,
    "FusedMoeFwdOp": _fused_moe,
}


def reference(op_name: str) -> Callable[..., RefResult]:
    """The reference for ``op_name``, from its manifest entry's ``ref_api``."""
    try:
        ref_api = manifest.entry(op_name).ref_api
    except LookupError:
        raise LookupError(f"no reference for {op_name!r}: no manifest declares it") from None
    if ref_api is None:
        written = _WRITTEN_OUT.get(op_name)
        if written is None:
            raise LookupError(
                f"no reference for {op_name!r}: its manifest says ref_api: none and "
                f"tileops.testing.references writes out only {sorted(_WRITTEN_OUT)}"
            )
        return written()
    return _ADAPTERS.get(ref_api, _api_call)(_api(ref_api))
