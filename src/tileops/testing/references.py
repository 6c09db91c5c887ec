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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from tileops import manifest
from tileops.rope_tables import cos_sin

Tensor = torch.Tensor
RefResult = Tensor | tuple[Tensor, ...]

_LOW_PRECISION = (torch.float16, torch.bfloat16)

# (rtol, atol). fp16/bf16 outputs are rounded once (bf16 has 8 mantissa bits, fp16 11);
# kernels accumulate in float32 but in their own order, hence the slack over one ulp.
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing an op's output of ``dtype`` with its reference.
    Integer and bool results must match exactly."""
    if dtype in _TOLERANCES:
        return _TOLERANCES[dtype]
    if dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"no tolerance defined for {dtype}")
    return (0.0, 0.0)


_IN_INPUT_DTYPE = [False]  # set by in_input_dtype(): compute as a same-dtype eager call


@contextlib.contextmanager
def in_input_dtype() -> Iterator[None]:
    """Within it, references compute float16/bfloat16 in that dtype (as a PyTorch user's
    eager call does) instead of in float32: a speed baseline (``tileops bench``), not a
    numeric one. Process-wide while it lasts."""
    saved = _IN_INPUT_DTYPE[0]
    _IN_INPUT_DTYPE[0] = True
    try:
        yield
    finally:
        _IN_INPUT_DTYPE[0] = saved


def _up(t: Tensor | None) -> Tensor | None:
    """float32 copy of a low-precision float tensor; anything else as is."""
    if t is not None and t.dtype in _LOW_PRECISION and not _IN_INPUT_DTYPE[0]:
        return t.float()
    return t


def _down(result: Tensor, like: Tensor) -> Tensor:
    return result.to(like.dtype)


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


def _attention_scores(q: Tensor, k: Tensor, scale: float, softcap: float) -> Tensor:
    scores = q @ k.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    return scores


def _gqa_fwd(fn: Callable[..., Tensor]) -> Callable[..., RefResult]:
    def ref(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        is_causal: bool,
        sm_scale: float | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        # sm_scale / softcap are constructor arguments of the op, not manifest params.
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        qf, kf, vf = (_up(t).transpose(1, 2) for t in (q, k, v))  # type: ignore[union-attr]  # BSHD -> BHSD
        if not softcap:
            out = fn(qf, kf, vf, is_causal=is_causal, scale=scale, enable_gqa=True)
        else:  # SDPA has no softcap: the same math, written out
            group = qf.shape[1] // kf.shape[1]
            kf, vf = kf.repeat_interleave(group, dim=1), vf.repeat_interleave(group, dim=1)
            scores = _attention_scores(qf, kf, scale, softcap)
            if is_causal:
                s = scores.shape[-1]
                mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
                scores = scores.masked_fill(~mask, float("-inf"))
            out = scores.softmax(dim=-1) @ vf
        return _down(out.transpose(1, 2), q)

    return ref


def _gqa_decode() -> Callable[..., RefResult]:
    def ref(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        sm_scale: float | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        batch, heads, dim = q.shape
        heads_kv = k.shape[2]
        scale = dim**-0.5 if sm_scale is None else sm_scale
        # Query head h reads kv head h // (heads / heads_kv), as repeat_interleave does.
        qf = _up(q).view(batch, heads_kv, heads // heads_kv, dim)  # type: ignore[union-attr]
        kf = _up(k).permute(0, 2, 3, 1)  # type: ignore[union-attr]  # [B, H_kv, D, N]
        vf = _up(v).permute(0, 2, 1, 3)  # type: ignore[union-attr]  # [B, H_kv, N, D]
        scores = qf @ kf * scale  # [B, H_kv, group, N]
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        out = scores.softmax(dim=-1) @ vf  # [B, H_kv, group, D]
        return _down(out.reshape(batch, heads, dim), q)

    return ref


# ---- serving attention: packed requests, paged caches (layouts in attention.yaml) ------


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    diag: int,
    causal: bool,
    left: int,
    right: int,
    scale: float | None,
    softcap: float | None,
) -> Tensor:
    """One request in float32: q [Lq, H, D] and k, v [Lk, H_kv, D] -> [Lq, H, D]. Query i
    sits on key diagonal i + diag; a query that sees no key gets zeros."""
    lq, heads, dim = q.shape
    group = heads // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
    scores = _attention_scores(q.float().transpose(0, 1), kf, dim**-0.5 if scale is None else scale, softcap or 0.0)
    i = torch.arange(lq, device=q.device)[:, None] + diag
    j = torch.arange(k.shape[0], device=q.device)[None, :]
    visible = torch.ones(lq, k.shape[0], dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= i
    elif right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    weights = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1).nan_to_num(0.0)
    return (weights @ vf).transpose(0, 1)


def _page_rows(block_table: Tensor, b: int, length: int, page_size: int) -> Tensor:
    """Cache rows of positions 0..length-1 of request b."""
    t = torch.arange(length, device=block_table.device)
    return block_table[b].long()[t // page_size] * page_size + t % page_size


def _spans(cu: Tensor) -> list[tuple[int, int]]:
    bounds = cu.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _packed(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    *,
    causal: bool,
    left: int,
    right: int,
    scale: float | None,
    softcap: float | None,
) -> Tensor:
    """Packed requests, bottom-right per request; rows past cu_q[-1] stay 0 (padding)."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for (q0, q1), (k0, k1) in zip(_spans(cu_q), _spans(cu_k)):
        out[q0:q1] = _attend(
            q[q0:q1],
            k[k0:k1],
            v[k0:k1],
            diag=(k1 - k0) - (q1 - q0),
            causal=causal,
            left=left,
            right=right,
            scale=scale,
            softcap=softcap,
        )
    return _down(out, q)


def _varlen_prefill() -> Callable[..., RefResult]:
    def ref(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_seqlens_q: Tensor,
        cu_seqlens_kv: Tensor,
        q_scale: Tensor | None = None,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
        *,
        is_causal: bool,
        sm_scale: float | None,
        softcap: float | None,
        window_size_left: int,
        window_size_right: int,
        **_: Any,
    ) -> Tensor:
        return _packed(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_kv,
            causal=is_causal,
            left=window_size_left,
            right=window_size_right,
            scale=sm_scale,
            softcap=softcap,
        )

    return ref


def _paged_prefill() -> Callable[..., RefResult]:
    def ref(
        q: Tensor,
        k_new: Tensor,
        v_new: Tensor,
        k_pages: Tensor,
        v_pages: Tensor,
        k_scale: Tensor | None,
        v_scale: Tensor | None,
        cu_seqlens_q: Tensor,
        cache_seqlens: Tensor,
        block_table: Tensor,
        *,
        page_size: int,
        is_causal: bool,
        sm_scale: float | None,
        softcap: float | None,
        window_size_left: int,
        **_: Any,
    ) -> Tensor:
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for b, (q0, q1) in enumerate(_spans(cu_seqlens_q)):
            cached = int(cache_seqlens[b])
            rows = _page_rows(block_table, b, cached + q1 - q0, page_size)
            k_pages[rows[cached:]] = k_new[q0:q1]  # the append, in place as the op does
            v_pages[rows[cached:]] = v_new[q0:q1]
            out[q0:q1] = _attend(
                q[q0:q1],
                k_pages[rows],
                v_pages[rows],
                diag=cached,
                causal=is_causal,
                left=window_size_left,
                right=-1,
                scale=sm_scale,
                softcap=softcap,
            )
        return _down(out, q)

    return ref


def _paged_decode() -> Callable[..., RefResult]:
    def ref(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        real_seqlen_kv: Tensor,
        block_table: Tensor,
        *,
        page_size: int,
        sm_scale: float | None,
        softcap: float | None,
        window_size_left: int,
    ) -> Tensor:
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for b, length in enumerate(real_seqlen_kv.tolist()):
            rows = _page_rows(block_table, b, length, page_size)
            out[b : b + 1] = _attend(
                q[b : b + 1],
                k[rows],
                v[rows],
                diag=length - 1,
                causal=True,
                left=window_size_left,
                right=-1,
                scale=sm_scale,
                softcap=softcap,
            )
        return _down(out, q)

    return ref


def _sliding_window() -> Callable[..., RefResult]:
    def ref(
        q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, window_size_left: int, window_size_right: int
    ) -> Tensor:
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for b in range(q.shape[0]):
            out[b] = _attend(
                q[b],
                k[b],
                v[b],
                diag=0,
                causal=is_causal,
                left=window_size_left,
                right=window_size_right,
                scale=None,
                softcap=None,
            )
        return _down(out, q)

    return ref


def _sliding_window_varlen() -> Callable[..., RefResult]:
    def ref(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor,
        *,
        is_causal: bool,
        window_size_left: int,
        window_size_right: int,
        **_: Any,
    ) -> Tensor:
        return _packed(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            causal=is_causal,
            left=window_size_left,
            right=window_size_right,
            scale=None,
            softcap=None,
        )

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
