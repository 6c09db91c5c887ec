"""The attention family's factory (csrc/kernels/attention*.h, csrc/bind/attention.cc): every
grouped-query attention op, one form each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._runtime import check_inputs, dtype_name, fail, native_dtype, shape_of, specialisation
from .common import Builder, Factory


def _attention_kernel(
    op: str,
    dtype: torch.dtype,
    form: str,
    q: Any,
    k: Any,
    *,
    slots: int,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    sm_scale: float | None = None,
    softcap: float | None = None,
    page_size: int = 0,
    padded: bool = False,
) -> Any:
    """The attention kernel of one form (csrc/bind/attention.cc's AttentionForm) for q's and
    k's head counts and head dim; row, request and cache counts are read per call."""
    heads, head_dim, heads_kv = int(q.shape[-2]), int(q.shape[-1]), int(k.shape[-2])
    if int(k.shape[-1]) != head_dim:
        raise fail(op, "q, k and v must share head_dim", f"q head_dim={head_dim}, k head_dim={k.shape[-1]}")
    if heads_kv == 0 or heads % heads_kv:
        raise fail(op, "heads must be a multiple of kv heads", f"H={heads}, H_kv={heads_kv}")
    if min(window) < -1:
        raise fail(op, "a window is -1 (off) or >= 0", f"window_size_left={window[0]}, window_size_right={window[1]}")
    group, scale, cap = heads // heads_kv, 0.0 if sm_scale is None else float(sm_scale), float(softcap or 0.0)
    if scale < 0 or cap < 0:
        raise fail(op, "sm_scale must be positive and softcap non-negative", f"sm_scale={sm_scale}, softcap={softcap}")
    describe = (
        f"{dtype_name(dtype)}, {form}, head_dim={head_dim}, group={group}, causal={causal}"
        + (f", window={window}" if window != (-1, -1) else "")
        + (f", sm_scale={scale}" if scale else "")
        + (f", softcap={cap}" if cap else "")
        + (f", page_size={page_size}" if page_size else "")
    )
    key = (dtype, form, head_dim, group, causal, window, scale, cap, page_size, padded, slots)
    return specialisation(
        op,
        key,
        describe,
        lambda C, threads, d: C.attention(
            native_dtype(dtype),
            getattr(C.AttentionForm, form),
            causal,
            head_dim,
            group,
            window[0],
            window[1],
            scale,
            cap,
            page_size,
            padded,
            slots,
            threads,
            d,
        ),
    )


def _shapes(op: str, layout: str, rules: Sequence[bool], **specs: Any) -> None:
    """Refuses, naming the layout and the shapes that arrived, unless every rule holds
    (each is the manifest's shape rule of the same meaning)."""
    if not all(rules):
        got = ", ".join(f"{name} {shape_of(spec)}" for name, spec in specs.items() if spec is not None)
        raise fail(op, f"expected {layout}", got)


def _each(op: str, dtype: torch.dtype, **specs: Any) -> None:
    """Inputs of a fixed dtype of their own (offsets, tables, descales); None is absent."""
    for name, spec in specs.items():
        if spec is not None:
            check_inputs(op, (dtype,), **{name: spec})


def _indices(op: str, **specs: Any) -> None:
    _each(op, torch.int32, **specs)


def _packed(op: str, q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, layout: str) -> None:
    """q [Tq, H, D], k and v [Tk, Hkv, D] with H a multiple of Hkv, offsets [B+1] each."""
    q_, k_, cq, ck = shape_of(q), shape_of(k), shape_of(cu_q), shape_of(cu_k)
    _shapes(op, layout, [len(q_) == 3, len(k_) == 3], q=q, k=k)
    _shapes(
        op,
        layout,
        [shape_of(v) == k_, k_[2] == q_[2], len(cq) == 1 and cq[0] >= 2, ck == cq],
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )


def attention(dtypes: Sequence[torch.dtype], *, form: str) -> Factory:
    """Grouped-query attention in one layout (``form``), H a multiple of H_kv:
    ``prefill`` q [B, S, H, D], k and v [B, S, Hkv, D], causal and windows;
    ``decode`` q [B, H, D] against a dense cache k and v [B, N, Hkv, D], N > 0;
    ``varlen`` packed requests (q [Tq, H, D], k and v [Tk, Hkv, D], cu_seqlens [B+1]);
    ``varlen_window`` the same with trailing padding rows and no scale or softcap;
    ``paged_prefill`` a chunk per request appended to a paged cache, then attended;
    ``paged_decode`` one query per request against a paged cache."""

    def factory(op: str) -> Builder:
        if form == "prefill":

            def build_prefill(
                q: Any,
                k: Any,
                v: Any,
                *,
                is_causal: bool = True,
                window_size_left: int = -1,
                window_size_right: int = -1,
            ) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                q_, k_ = shape_of(q), shape_of(k)
                layout = "q [B, S, H, D], k and v [B, S, H_kv, D]"
                _shapes(op, layout, [len(q_) == 4, len(k_) == 4], q=q, k=k)
                _shapes(op, layout, [shape_of(v) == k_, k_[0] == q_[0], k_[3] == q_[3]], q=q, k=k, v=v)
                if k_[1] != q_[1]:
                    raise fail(op, "k and v must have q's sequence length", f"q {q_}, k {k_}")
                return _attention_kernel(
                    op,
                    dtype,
                    "prefill",
                    q,
                    k,
                    slots=3,
                    causal=bool(is_causal),
                    window=(int(window_size_left), int(window_size_right)),
                )

            return build_prefill
        if form == "decode":

            def build_decode(q: Any, k: Any, v: Any) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                q_, k_ = shape_of(q), shape_of(k)
                layout = "q [B, H, D], k and v [B, N_kv, H_kv, D] with N_kv > 0"
                _shapes(op, layout, [len(q_) == 3, len(k_) == 4], q=q, k=k)
                _shapes(op, layout, [shape_of(v) == k_, k_[0] == q_[0], k_[3] == q_[2]], q=q, k=k, v=v)
                if k_[1] == 0:
                    raise fail(op, "the cache must hold at least one position", f"k of shape {k_}")
                return _attention_kernel(op, dtype, "decode", q, k, slots=3, causal=True)

            return build_decode
        if form == "varlen":

            def build_varlen(
                q: Any,
                k: Any,
                v: Any,
                cu_seqlens_q: Any,
                cu_seqlens_kv: Any,
                q_scale: Any = None,
                k_scale: Any = None,
                v_scale: Any = None,
                *,
                max_seqlen_q: int,
                max_seqlen_kv: int,
                is_causal: bool = True,
                sm_scale: float | None = None,
                softcap: float | None = None,
                window_size_left: int = -1,
                window_size_right: int = -1,
            ) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                _indices(op, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv)
                _each(op, torch.float32, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
                layout = "q [total_q, H, D], k and v [total_kv, H_kv, D], cu_seqlens [B+1], descales [B, H_kv]"
                _packed(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, layout)
                descale = (int(cu_seqlens_q.shape[0]) - 1, int(k.shape[1]))
                _shapes(
                    op,
                    layout,
                    [s is None or shape_of(s) == descale for s in (q_scale, k_scale, v_scale)],
                    q_scale=q_scale,
                    k_scale=k_scale,
                    v_scale=v_scale,
                )
                return _attention_kernel(
                    op,
                    dtype,
                    "varlen",
                    q,
                    k,
                    slots=8,
                    causal=bool(is_causal),
                    window=(int(window_size_left), int(window_size_right)),
                    sm_scale=sm_scale,
                    softcap=softcap,
                )

            return build_varlen
        if form == "varlen_window":

            def build_varlen_window(
                q: Any,
                k: Any,
                v: Any,
                cu_seqlens_q: Any,
                cu_seqlens_k: Any,
                *,
                is_causal: bool = True,
                window_size_left: int = -1,
                window_size_right: int = -1,
                max_seqlen_q: int,
            ) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                _indices(op, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
                _packed(
                    op,
                    q,
                    k,
                    v,
                    cu_seqlens_q,
                    cu_seqlens_k,
                    "q [total_q, H, D], k and v [total_k, H_kv, D], cu_seqlens [B+1]",
                )
                return _attention_kernel(
                    op,
                    dtype,
                    "varlen",
                    q,
                    k,
                    slots=5,
                    causal=bool(is_causal),
                    window=(int(window_size_left), int(window_size_right)),
                    padded=True,
                )

            return build_varlen_window
        if form == "paged_prefill":

            def build_paged_prefill(
                q: Any,
                k_new: Any,
                v_new: Any,
                k_pages: Any,
                v_pages: Any,
                k_scale: Any,
                v_scale: Any,
                cu_seqlens_q: Any,
                cache_seqlens: Any,
                block_table: Any,
                *,
                max_pages_per_req: int,
                page_size: int,
                max_seqlen_q: int,
                is_causal: bool = True,
                sm_scale: float | None = None,
                softcap: float | None = None,
                window_size_left: int = -1,
            ) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k_new=k_new, v_new=v_new, k_pages=k_pages, v_pages=v_pages)
                _indices(op, cu_seqlens_q=cu_seqlens_q, cache_seqlens=cache_seqlens, block_table=block_table)
                _each(op, torch.float32, k_scale=k_scale, v_scale=v_scale)
                if int(page_size) <= 0:
                    raise fail(op, "page_size must be positive", f"page_size={page_size}")
                layout = (
                    "q [total_q, H, D], k_new and v_new [total_q, H_kv, D], pages [N * page_size, H_kv, D], "
                    "cu_seqlens_q [B+1], cache_seqlens [B], block_table [B, max_pages_per_req], scales [1]"
                )
                q_, kn, kp, cq = shape_of(q), shape_of(k_new), shape_of(k_pages), shape_of(cu_seqlens_q)
                specs = dict(
                    q=q,
                    k_new=k_new,
                    v_new=v_new,
                    k_pages=k_pages,
                    v_pages=v_pages,
                    cu_seqlens_q=cu_seqlens_q,
                    cache_seqlens=cache_seqlens,
                    block_table=block_table,
                    k_scale=k_scale,
                    v_scale=v_scale,
                )
                _shapes(op, layout, [len(q_) == 3, len(kn) == 3, len(kp) == 3, len(cq) == 1], **specs)
                _shapes(
                    op,
                    layout,
                    [
                        kn[0] == q_[0],
                        kn[2] == q_[2],
                        shape_of(v_new) == kn,
                        kp[1:] == kn[1:],
                        shape_of(v_pages) == kp,
                        kp[0] % int(page_size) == 0,
                        cq[0] >= 2,
                        shape_of(cache_seqlens) == (cq[0] - 1,),
                        shape_of(block_table) == (cq[0] - 1, int(max_pages_per_req)),
                        all(s is None or shape_of(s) == (1,) for s in (k_scale, v_scale)),
                    ],
                    **specs,
                )
                return _attention_kernel(
                    op,
                    dtype,
                    "paged_prefill",
                    q,
                    k_pages,
                    slots=10,
                    causal=bool(is_causal),
                    sm_scale=sm_scale,
                    softcap=softcap,
                    page_size=int(page_size),
                    window=(int(window_size_left), -1),
                )

            return build_paged_prefill
        if form == "paged_decode":

            def build_paged_decode(
                q: Any,
                k: Any,
                v: Any,
                real_seqlen_kv: Any,
                block_table: Any,
                *,
                page_size: int,
                sm_scale: float | None = None,
                softcap: float | None = None,
                window_size_left: int = -1,
            ) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                _indices(op, real_seqlen_kv=real_seqlen_kv, block_table=block_table)
                if int(page_size) <= 0:
                    raise fail(op, "page_size must be positive", f"page_size={page_size}")
                layout = "q [B, H, D], k and v [N * page_size, H_kv, D], real_seqlen_kv [B], block_table [B, P]"
                q_, k_, bt = shape_of(q), shape_of(k), shape_of(block_table)
                specs = dict(q=q, k=k, v=v, real_seqlen_kv=real_seqlen_kv, block_table=block_table)
                _shapes(op, layout, [len(q_) == 3, len(k_) == 3], **specs)
                _shapes(
                    op,
                    layout,
                    [
                        shape_of(v) == k_,
                        k_[2] == q_[2],
                        k_[0] % int(page_size) == 0,
                        shape_of(real_seqlen_kv) == (q_[0],),
                        len(bt) == 2 and bt[0] == q_[0],
                    ],
                    **specs,
                )
                return _attention_kernel(
                    op,
                    dtype,
                    "paged_decode",
                    q,
                    k,
                    slots=5,
                    causal=True,
                    sm_scale=sm_scale,
                    softcap=softcap,
                    page_size=int(page_size),
                    window=(int(window_size_left), -1),
                )

            return build_paged_decode
        raise ValueError(f"unknown attention form {form!r}")

    return factory
