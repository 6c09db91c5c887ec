"""The per-instance forwards ``enable`` gives served modules (``module.forward``), each
over the ops in the module's ``_tileops`` state.

Each forward takes transformers' shapes (``[B, S, hidden]``) and is a thin shell over a
*rows* form that takes the tokens as rows ``[T, hidden]``, as the ops do. The fused
model forward (``fused/model.py``) calls the rows forms directly, so a module's
arithmetic lives in one place whichever way it runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention import attend
from ..cache import TileopsCache
from .fusion import norm_weight

__all__ = [
    "linear_forward",
    "linear_rows",
    "embedding_forward",
    "embedding_rows",
    "rmsnorm_forward",
    "mlp_forward",
    "mlp_rows",
    "attention_forward",
    "attention_rows",
    "positions_of",
]


def linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = linear_rows(self, x.reshape(-1, x.shape[-1]).contiguous())
    return y.view(*x.shape[:-1], y.shape[-1])


def linear_rows(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    st = self._tileops
    y = st.gemm(x, *(st.prepared or [getattr(self, a) for a in st.weight_attrs]))
    return y if self.bias is None else st.add(y, self.bias)


def embedding_forward(self: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """A GgufEmbedding's rows ``[*ids.shape, dim]``, looked up in its blocks."""
    return embedding_rows(self, ids.reshape(-1)).view(*ids.shape, -1)


def embedding_rows(self: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return self._tileops.lookup(ids, self.weight_blocks)


def rmsnorm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self._tileops.norm(x.contiguous(), norm_weight(self))


def mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    st = self._tileops
    x2 = x.reshape(-1, x.shape[-1])
    if getattr(st, "gate_up", None) is not None:  # one GEMM over the stacked weights (fused/fusion.py)
        gate_up = st.gate_up(x2.contiguous())
    else:
        gate_up = (
            self.gate_up_proj(x2)
            if hasattr(self, "gate_up_proj")
            else (torch.cat([self.gate_proj(x2), self.up_proj(x2)], dim=-1))
        )  # [M, 2I]: gate | value
    return self.down_proj(st.act(gate_up)).view(*x.shape[:-1], -1)


def mlp_rows(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A gated MLP whose gate/up are stacked and whose down projection is served, on rows."""
    st = self._tileops
    return linear_rows(self.down_proj, st.act(st.gate_up(x)))


def attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: Any = None,
    attention_mask: Any = None,
    cache: Any = None,
    past_key_values: Any = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
):
    cache = cache if cache is not None else past_key_values
    batch, q_len, _ = hidden_states.shape
    pos = positions_of(self, position_ids, batch, q_len)
    x = hidden_states.reshape(batch * q_len, -1).contiguous()
    out = attention_rows(self, x, batch, q_len, pos, attention_mask, cache)
    return self.o_proj(out.view(batch, q_len, -1)), None


def positions_of(self: nn.Module, position_ids: torch.Tensor | None, batch: int, q_len: int) -> torch.Tensor:
    """The checked positions of a forward's tokens as rows ``[B * S]``."""
    st = self._tileops
    if position_ids is None:
        raise ValueError(f"{st.name}: tileops RoPE needs position_ids (transformers' decoder layers pass them)")
    pos = position_ids.expand(batch, q_len).reshape(-1)
    st.positions.check(
        position_ids, pos, st.name, " (dynamic NTK scaling past it is not served)" if st.rope_type == "dynamic" else ""
    )
    return pos


def attention_rows(
    self: nn.Module, x: torch.Tensor, batch: int, q_len: int, pos: torch.Tensor, attention_mask: Any, cache: Any
) -> torch.Tensor:
    """A served attention module up to its output projection: x ``[B * S, hidden]`` (the
    batch's tokens, row b * S + s) -> the heads' outputs ``[B * S, H * D]``."""
    st = self._tileops
    if cache is not None and not isinstance(cache, TileopsCache):
        raise TypeError(
            f"{st.name}: tileops attention reads a TileopsCache, got {type(cache).__name__} "
            "(let the enabled model make its cache, or pass TileopsCache(config=model.config) as cache=, "
            "past_key_values= before transformers 5.24)"
        )
    dim, rows = self.head_dim, x.shape[0]
    # A batch's decode step runs each projection on its own (a GEMM over its rows of the
    # stacked weight): sliced from one output, q, k and v are strided when there are
    # several rows and would be copied for RoPE between the kernels, which keeps the step
    # from being replayed (decode/replay.py).
    if st.qkv is not None and (rows == 1 or q_len > 1):  # one GEMM (fused/fusion.py)
        q, k, v = st.qkv(x).split(st.qkv.sizes, dim=-1)
    elif st.qkv is not None:
        q, k, v = st.qkv.parts(x)
    else:
        q, k, v = (p(x) for p in (self.q_proj, self.k_proj, self.v_proj))
    if st.qk_norm == "projection":  # OLMo 2: over each token's whole projection, before the heads
        q, k = self.q_norm(q), self.k_norm(k)
    q, k, v = (t.view(rows, -1, dim) for t in (q, k, v))
    if st.qk_norm == "head":  # Qwen3, Gemma 3: per head
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = st.rope(q, pos), st.rope(k, pos)
    split = lambda t: t.view(batch, q_len, t.shape[1], dim)  # noqa: E731  (rows b * S + s: always a view)
    out = attend(
        self,
        split(q),
        split(k),
        split(v),
        attention_mask,
        cache,
        scaling=st.scaling,
        sliding_window=st.window,
        softcap=st.softcap,
        position_ids=pos.view(batch, q_len),
    )
    return out.view(rows, -1)
