"""The attention references (tileops.testing.references): grouped-query attention through
SDPA or written out with a softcap, its decode form, and the serving forms (packed
requests, paged caches, sliding windows) written out per request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._reference_base import RefResult, Tensor, _down, _up


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
