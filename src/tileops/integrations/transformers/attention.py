"""Attention on tileops ops, registered with transformers as ``"tileops"`` in both
``AttentionInterface`` (the attention itself) and ``AttentionMaskInterface`` (the mask it
gets: the 2-D padding mask, which a registered attention alone would not receive).

Layouts: transformers hands attention ``query [B, H, S, D]`` and ``key, value
[B, H_kv, S, D]``; tileops' ops take packed rows ``[T, H, D]``. ``attend`` takes
``[B, S, H, D]``: the patched attention forward (``fused/forwards.py``) calls it with the
projections' own layout, and the registered function with transposed views of
transformers', so no copy is made either way.

- With a ``TileopsCache`` (``generate``, ``use_cache=True``): each request's real tokens
  (left padding dropped) are packed and run through
  ``GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp``, which writes them into the layer's
  pools and attends over the request's cached tokens and the new ones (causal, window,
  softcap, scale). Prefill, decode (a chunk of one token per request) and a prefill onto
  cached tokens (chunked prefill, assisted decoding) are the same call; the lengths, offsets
  and block table are the cache's ``Step``, made once per forward for every layer.
- Without a cache: ``GroupedQueryAttentionPrefillFwdOp`` (varlen) over the chunk alone.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from tileops.serving import PagedKVCache

from .cache import TileopsCache, new_token_counts

NAME = "tileops"


def mask_for_tileops(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
):
    """The mask tileops attention gets: the 2-D boolean padding mask ``[B, kv_length]``
    (None when nothing is padded). Causality and windows are the ops' own params."""
    return padding_mask(attention_mask, q_length)


def padding_mask(attention_mask: torch.Tensor | None, q_length: int) -> torch.Tensor | None:
    """A 2-D padding mask as tileops attention takes it: boolean, or None when nothing is
    padded and there are cached tokens. Over a forward's tokens alone, a mask given stays,
    even one with nothing padded: transformers reads position ids that restart as
    sequences packed into a row only where no mask was given (``attend``)."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask.to(torch.bool)
    if attention_mask.shape[-1] == q_length:
        return attention_mask
    return None if bool(attention_mask.all()) else attention_mask


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def tileops_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    tileops_cache: TileopsCache | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
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
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D]
    out = attend(
        module,
        q,
        k,
        v,
        attention_mask,
        tileops_cache,
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
        position_ids=kwargs.get("position_ids"),
    )
    return out, None


def attend(
    module: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: TileopsCache | None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, S, H, D], k and v [B, S, H_kv, D] (this forward's tokens) -> [B, S, H, D].

    With a cache, the paged prefill op appends the real tokens to this layer's pools and
    attends over everything cached (a decode step is a chunk of one token per sequence);
    without one, the varlen prefill op attends over the chunk alone, each of the
    sequences packed into a row on its own where ``position_ids`` restart within it."""
    state = module._tileops
    batch, q_len, heads, dim = q.shape
    window = -1 if sliding_window is None else sliding_window - 1  # transformers keeps kv > q - window
    scale = state.scaling if scaling is None else scaling
    cap = softcap or 0.0
    if cache is not None:
        layer = cache.layers[module.layer_idx]
        step = cache.step_for(layer, q_len, attention_mask, k)
        counts = step.counts
    else:
        counts = tuple(new_token_counts(attention_mask, batch, q_len, [0] * batch))
    packed = (
        None
        if cache is not None or attention_mask is not None or position_ids is None
        else (packed_lengths(position_ids, batch, q_len))
    )
    padded = any(n != q_len for n in counts)
    flat = lambda t: t.reshape(batch * q_len, t.shape[2], dim)  # noqa: E731  (a view when [B, S] is contiguous)
    if padded:
        rows = torch.cat([torch.arange(b * q_len + q_len - n, (b + 1) * q_len) for b, n in enumerate(counts)])
        rows = rows.to(q.device)
        qp, kp, vp = (flat(t).index_select(0, rows) for t in (q, k, v))
    else:
        qp, kp, vp = flat(q), flat(k), flat(v)
    longest = _pow2(max(max(packed or counts), 1))
    if cache is not None:
        k_pages, v_pages = layer.pools()
        op = state.paged(step.width, longest, scale, cap, window)
        out_p = op(qp, kp, vp, k_pages, v_pages, None, None, step.cu_seqlens_q, step.cache_seqlens, step.block_table)
    else:
        cu = PagedKVCache.cu_seqlens(packed or counts, q.device)
        out_p = state.prefill(longest, longest, scale, cap, window)(qp, kp, vp, cu, cu)
    if not padded:
        return out_p.view(batch, q_len, heads, dim)
    out = torch.zeros(batch * q_len, heads, dim, dtype=out_p.dtype, device=out_p.device)
    out.index_copy_(0, rows, out_p)
    return out.view(batch, q_len, heads, dim)


def packed_lengths(position_ids: torch.Tensor, batch: int, q_len: int) -> list[int] | None:
    """The lengths, in row order, of the sequences packed into the rows of a cacheless,
    unmasked forward, or None when each row is one sequence. transformers' packed format
    (the one its masks follow): a sequence starts wherever a position is not the one
    before it plus one."""
    pos = position_ids.expand(batch, q_len)
    starts = torch.ones(batch, q_len, dtype=torch.bool, device=pos.device)
    starts[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
    if int(starts.sum()) == batch:
        return None
    first = starts.reshape(-1).nonzero().flatten().tolist()
    return [end - begin for begin, end in zip(first, first[1:] + [batch * q_len])]


def register() -> None:
    """Registers ``"tileops"`` with transformers (idempotent)."""
    AttentionInterface.register(NAME, tileops_attention)
    AttentionMaskInterface.register(NAME, mask_for_tileops)
