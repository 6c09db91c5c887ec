"""Attention on tileops ops, registered with transformers as ``"tileops"`` in both
``AttentionInterface`` (the attention itself) and ``AttentionMaskInterface`` (the mask it
gets: the 2-D padding mask, which a registered attention alone would not receive).

Layouts: transformers hands attention ``query [B, H, S, D]`` and ``key, value
[B, H_kv, S, D]``; tileops' ops take packed rows ``[T, H, D]``. The patched attention
forward (``_attention_forward``) makes q/k/v as ``[B, S, H, D]`` (the projections' own
layout) and passes transposed views, so no copy is made to go back.

- Prefill: each request's real tokens (left padding dropped) are packed and run through
  ``GroupedQueryAttentionPrefillFwdOp`` (varlen, causal, window, softcap, scale), then
  appended to the layer's ``PagedKVCache``.
- Decode (one new token per request, all cached): the token is appended and
  ``GroupedQueryAttentionDecodePagedWithKVCacheFwdOp`` reads the pages in place.
- A prefill onto a non-empty cache (chunked prefill, assisted decoding) gathers the cached
  tokens (a copy: a rare path) and runs the varlen op over them.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ._cache import TileopsCache, TileopsCacheLayer

NAME = "tileops"
I32 = torch.int32


def mask_for_tileops(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                     mask_function: Any = None, attention_mask: torch.Tensor | None = None, **kwargs: Any):
    """The mask tileops attention gets: the 2-D boolean padding mask ``[B, kv_length]``
    (None when nothing is padded). Causality and windows are the ops' own params."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask.to(torch.bool)
    return None if bool(attention_mask.all()) else attention_mask


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _new_token_counts(attention_mask: torch.Tensor | None, batch: int, q_len: int, cached: list[int]) -> list[int]:
    """Real new tokens per request from the padding mask: they must be the last ones of
    the chunk (left padding), and a request that has cached tokens gets no pads."""
    if attention_mask is None:
        return [q_len] * batch
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2:
        raise ValueError(
            "tileops attention takes the 2-D padding mask [batch, kv_len] that its mask function "
            f"(AttentionMaskInterface '{NAME}') makes, got "
            f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}: a custom 4-D mask is not served"
        )
    new = attention_mask[:, -q_len:].to(torch.bool)
    counts = new.sum(dim=1)
    left_padded = torch.arange(q_len, device=new.device)[None, :] >= (q_len - counts)[:, None]
    counts = counts.tolist()
    if not bool(torch.equal(new, left_padded)) or any(c and n != q_len for c, n in zip(cached, counts)):
        raise ValueError(
            "tileops attention serves left padding only: each row of attention_mask must be 0s then 1s "
            "(pass padding_side='left' to the tokenizer)"
        )
    return counts


def tileops_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      sliding_window: int | None = None, softcap: float | None = None,
                      tileops_cache: TileopsCache | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, H, S, D], key/value [B, H_kv, S, D]
    (this step's tokens; the cache is ``tileops_cache``) -> ([B, S, H, D], None)."""
    if dropout:
        raise ValueError("tileops attention is inference only: dropout must be 0 (call model.eval())")
    state = module.__dict__.get("_tileops")
    if state is None:
        raise RuntimeError(
            f"attention implementation '{NAME}' runs on modules that tileops.integrations.transformers."
            f"enable(model) patched; {type(module).__name__} was not (call enable(model) instead of "
            "setting the attention implementation by hand)"
        )
    batch, heads, q_len, dim = query.shape
    heads_kv = key.shape[1]
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D]
    layer: TileopsCacheLayer | None = None
    if tileops_cache is not None:
        layer = tileops_cache.layers[module.layer_idx]
    cached = layer.lengths(batch) if layer is not None else [0] * batch
    counts = _new_token_counts(attention_mask, batch, q_len, cached)
    window = -1 if sliding_window is None else sliding_window - 1  # transformers keeps kv > q - window
    scale = state.scaling if scaling is None else scaling
    cap = softcap or 0.0

    if layer is not None and q_len == 1 and all(c > 0 for c in cached) and all(n == 1 for n in counts):
        layer.append(k.reshape(batch, heads_kv, dim), v.reshape(batch, heads_kv, dim), counts)
        layer.seen += 1
        out = state.decode(scale, cap, window)(
            q.reshape(batch, heads, dim), layer.paged.k_pages, layer.paged.v_pages,
            layer.paged.seqlens(layer.seqs), layer.block_table(),
        )
        return out.view(batch, 1, heads, dim), None

    padded = any(n != q_len for n in counts)
    flat = lambda t: t.reshape(batch * q_len, t.shape[2], dim)  # noqa: E731  (a view: [B, S] is contiguous)
    if padded:
        rows = torch.cat([torch.arange(b * q_len + q_len - n, (b + 1) * q_len) for b, n in enumerate(counts)])
        rows = rows.to(query.device)
        qp, kp, vp = (flat(t).index_select(0, rows) for t in (q, k, v))
    else:
        qp, kp, vp = flat(q), flat(k), flat(v)
    cu_q = _cumsum(counts, query.device)
    if layer is not None:
        layer.append(kp, vp, counts)
        layer.seen += q_len
    if not any(cached):
        cu_kv, max_kv = cu_q, max(counts)
    else:  # a prefill onto cached tokens: the varlen op over what the cache gathers
        gathered = [layer.paged.gather(s) for s in layer.seqs]
        kp = torch.cat([g[0] for g in gathered])
        vp = torch.cat([g[1] for g in gathered])
        lengths = [c + n for c, n in zip(cached, counts)]
        cu_kv, max_kv = _cumsum(lengths, query.device), max(lengths)
    op = state.prefill(_pow2(max(max(counts), 1)), _pow2(max(max_kv, 1)), scale, cap, window)
    out_p = op(qp, kp, vp, cu_q, cu_kv)
    if not padded:
        return out_p.view(batch, q_len, heads, dim), None
    out = torch.zeros(batch * q_len, heads, dim, dtype=out_p.dtype, device=out_p.device)
    out.index_copy_(0, rows, out_p)
    return out.view(batch, q_len, heads, dim), None


def _cumsum(counts: list[int], device: torch.device) -> torch.Tensor:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return torch.tensor(out, dtype=I32, device=device)


def register() -> None:
    """Registers ``"tileops"`` with transformers (idempotent)."""
    AttentionInterface.register(NAME, tileops_attention)
    AttentionMaskInterface.register(NAME, mask_for_tileops)
