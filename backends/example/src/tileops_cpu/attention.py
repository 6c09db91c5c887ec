"""Serving attention over packed requests: GroupedQueryAttentionPrefillFwdOp (varlen) and
GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp (a chunk per request appended to a paged
KV cache, then attended).

Layouts (attention.yaml): q [total_q, H, D], k and v [total_kv, H_kv, D]; request b owns
rows cu_seqlens[b] .. cu_seqlens[b+1] - 1. A paged cache is one flat
[num_pages * page_size, H_kv, D] tensor per K and V, position t of request b at row
block_table[b, t // page_size] * page_size + t % page_size. Query head h reads kv head
h // (H / H_kv). Query i of a request with Lq queries and Lk keys sits on key diagonal
i + (Lk - Lq) (bottom-right): causal keeps keys j <= that, a left window j >= diagonal -
window_size_left, a right window (not causal) j <= diagonal + window_size_right; -1 is no
bound. A query that sees no key gets zeros.

Each request is attended on its own, in float32, with its scores written out; a real
backend fuses this (flash attention) and never holds a whole score matrix.
"""

from __future__ import annotations

import torch


def _spans(offsets: torch.Tensor) -> list[tuple[int, int]]:
    """(begin, end) of each request's rows, from offsets [B+1]."""
    bounds = offsets.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


class _Attention:
    """What both forms share: the head layout, the mask and the scores of one request."""

    def __init__(
        self,
        heads: int,
        heads_kv: int,
        head_dim: int,
        *,
        causal: bool,
        sm_scale: float | None,
        softcap: float | None,
        window_left: int,
        window_right: int,
        dtype: torch.dtype,
    ) -> None:
        self.heads, self.heads_kv, self.head_dim = int(heads), int(heads_kv), int(head_dim)
        self.group = self.heads // self.heads_kv
        self.causal = bool(causal)
        self.scale = head_dim**-0.5 if sm_scale is None else float(sm_scale)
        self.softcap = float(softcap or 0.0)  # 0: no cap
        self.window_left, self.window_right = int(window_left), int(window_right)
        self.dtype = dtype

    def _visible(self, q_len: int, kv_len: int, diagonal: int) -> torch.Tensor:
        """[q_len, kv_len] bool: which keys each query sees; query i is on diagonal i + diagonal."""
        i = torch.arange(q_len)[:, None] + diagonal
        j = torch.arange(kv_len)[None, :]
        visible = torch.ones(q_len, kv_len, dtype=torch.bool)
        if self.causal:
            visible &= j <= i
        elif self.window_right >= 0:
            visible &= j <= i + self.window_right
        if self.window_left >= 0:
            visible &= j >= i - self.window_left
        return visible

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: int) -> torch.Tensor:
        """One request: q [Lq, H, D], k and v [Lk, H_kv, D] -> float32 [Lq, H, D]."""
        kf = k.float().repeat_interleave(self.group, dim=1)  # [Lk, H, D]: kv head h // group
        vf = v.float().repeat_interleave(self.group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * self.scale
        if self.softcap > 0:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        visible = self._visible(q.shape[0], k.shape[0], diagonal)
        weights = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        # a query that sees no key has only -inf scores, whose softmax is NaN: zeros instead
        weights = weights.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0)
        return torch.einsum("hqk,khd->qhd", weights, vf)

    def _describe(self) -> str:
        return (
            f"heads={self.heads}, heads_kv={self.heads_kv}, head_dim={self.head_dim}, "
            f"causal={self.causal}, scale={self.scale:.4g}, softcap={self.softcap}, "
            f"window=({self.window_left}, {self.window_right}), dtype={self.dtype}"
        )


class CpuVarlenAttention(_Attention):
    """q [Tq, H, D], k and v [Tk, H_kv, D], cu_seqlens_q / cu_seqlens_kv [B+1] ->
    o [Tq, H, D]. The fp8 descales (q_scale, k_scale, v_scale) are accepted and ignored:
    16-bit inputs carry no scale."""

    @torch.no_grad()
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_kv: torch.Tensor,
        q_scale: torch.Tensor | None = None,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = torch.zeros(q.shape, dtype=torch.float32)
        for (q0, q1), (k0, k1) in zip(_spans(cu_seqlens_q), _spans(cu_seqlens_kv)):
            if q1 > q0:
                out[q0:q1] = self.attend(q[q0:q1], k[k0:k1], v[k0:k1], (k1 - k0) - (q1 - q0))
        return out.to(self.dtype)

    def __repr__(self) -> str:
        return f"CpuVarlenAttention({self._describe()})"


class CpuPagedPrefillAttention(_Attention):
    """Chunked prefill into a paged cache. Request b's chunk, rows cu_seqlens_q[b] ..
    cu_seqlens_q[b+1] - 1 of k_new / v_new, is written into k_pages / v_pages IN PLACE at
    positions cache_seqlens[b] onwards; then each query attends over its request's cache,
    the chunk included (query i at position cache_seqlens[b] + i). A decode step is a
    chunk of one token per request. Returns o [total_q, H, D]."""

    def __init__(self, heads: int, heads_kv: int, head_dim: int, *, page_size: int, **kw) -> None:
        super().__init__(heads, heads_kv, head_dim, window_right=-1, **kw)
        self.page_size = int(page_size)

    def _rows(self, table_row: torch.Tensor, begin: int, end: int) -> torch.Tensor:
        """Cache rows of positions begin .. end - 1 of the request whose table row is given."""
        t = torch.arange(begin, end)
        return table_row.long()[t // self.page_size] * self.page_size + t % self.page_size

    @torch.no_grad()
    def __call__(
        self,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
        cu_seqlens_q: torch.Tensor,
        cache_seqlens: torch.Tensor,
        block_table: torch.Tensor,
    ) -> torch.Tensor:
        spans, cached = _spans(cu_seqlens_q), cache_seqlens.tolist()
        # 1. The append: every request's chunk into the pools, before anything is read, so
        # each query sees its own request's new keys (the op's manifest says the pools are
        # mutated; the caller's tensors must change, never a copy of them).
        for b, (q0, q1) in enumerate(spans):
            rows = self._rows(block_table[b], cached[b], cached[b] + q1 - q0)
            k_pages.index_copy_(0, rows, k_new[q0:q1])
            v_pages.index_copy_(0, rows, v_new[q0:q1])
        # 2. Attention over each request's whole cache, its chunk last.
        out = torch.zeros(q.shape, dtype=torch.float32)
        for b, (q0, q1) in enumerate(spans):
            if q1 == q0:
                continue
            rows = self._rows(block_table[b], 0, cached[b] + q1 - q0)
            out[q0:q1] = self.attend(q[q0:q1], k_pages[rows], v_pages[rows], cached[b])
        return out.to(self.dtype)

    def __repr__(self) -> str:
        return f"CpuPagedPrefillAttention({self._describe()}, page_size={self.page_size})"
