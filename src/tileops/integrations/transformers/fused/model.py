"""The base model's forward as one loop over fused decoder layers.

When every decoder layer of a model is fused (``fused/fusion.py``) and its final norm is
served, a forward needs nothing of transformers' base-model machinery: its mask builders
make the 2-D padding mask tileops attention reads anyway, its rotary tables go unused
(the RoPE ops take positions), and its module calls only carry hooks. This loop runs the
same tileops ops in the same order, calling each piece's rows form (``fused/forwards.py``)
directly, and joins the residual add that ends a layer with the next layer's input norm
(the last layer's with the final norm) in one ``FusedAddRMSNormFwdOp``, as ``fused/fusion.py``
already does inside a layer. The op adds in the model dtype and normalises the rounded sum,
exactly as transformers' add and norm do, so results are the same bits.

Why: a decode step is about ten op calls per layer around the streaming of every weight,
and transformers' module machinery around them is Python that runs on caches the weights
have just flushed (docs/performance.md has the figures).

The loop runs only where transformers' forward would add nothing to it:
- no forward hooks on the model's modules, nor global ones (a hook is the user's, or
  transformers' own for ``output_hidden_states``);
- no hidden states, attentions or router logits asked for, by argument or config;
- a 2-D padding mask, or none (a dict of them, as ``generate`` prepares for some models);
- input ids or embeddings, and no argument it does not know.
Any other call runs transformers' forward over the same patched modules.

A decode step (one token per sequence, on a cache) goes through ``DecodeReplay``
(``decode/replay.py``), which replays the layers' op launches from a captured graph where
that is safe and runs ``layers_forward`` otherwise. A plain causal LM's decode step
(``planning/enable.py``) comes to ``decode_logits`` instead, whose graph ends with the LM head.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils import ModelOutput

from ..attention import padding_mask
from ..cache import TileopsCache
from ..compat import cache_field, pop_cache
from ..decode.replay import DecodeReplay, replay_wanted
from .forwards import attention_rows, linear_rows, mlp_rows, positions_of, rmsnorm_forward
from .fusion import ResidualJoin

__all__ = ["FusedModel", "output_class", "plan_fused_model"]

_FLAGS = ("output_attentions", "output_hidden_states", "output_router_logits")
_KNOWN = {
    "input_ids",
    "attention_mask",
    "position_ids",
    "inputs_embeds",
    "use_cache",
    "return_dict",
    "cache_position",
    *_FLAGS,
}


class FusedModel:
    """The fused forward of one base model (``model.model``)."""

    def __init__(
        self,
        base: nn.Module,
        layers: list[nn.Module],
        joins: list[ResidualJoin],
        gated: list[bool],
        layer_types: list[str] | None,
    ) -> None:
        self.base, self.layers, self.gated, self.layer_types = base, layers, gated, layer_types
        self.joins = (
            joins  # per layer: its output's residual add and the norm that reads it (the next layer's or the final)
        )
        self.embedding_multiplier = float(getattr(base, "embedding_multiplier", 1.0))  # Granite's
        # a served embedding (GgufEmbedding's op) unscaled: a replayed decode step embeds its
        # token ids itself, so its input is the ids (decode/replay.py)
        self.step_embeds = "_tileops" in base.embed_tokens.__dict__ and self.embedding_multiplier == 1.0
        self.output = output_class(base)
        self.cache_field = cache_field(self.output)
        self.submodules = list(base.modules())  # whose hooks send a call to transformers' forward
        # their hook dicts, which registering a hook fills in place: checked on every forward,
        # so one flat tuple to test (a decode step's Python runs on caches its weights flushed)
        self.hook_dicts = tuple(d for m in self.submodules for d in (m._forward_hooks, m._forward_pre_hooks))
        self.replay = DecodeReplay(self) if all(gated) and replay_wanted() else None

    def held_ops(self) -> list[Any]:
        """The ops of the joins between the layers (the layers' own are their modules')."""
        return [op for join in self.joins for op in join.held_ops()]

    def accepts(self, kwargs: dict) -> bool:
        if any(k not in _KNOWN for k in kwargs):
            return False
        config = self.base.config
        if any(kwargs.get(f) or getattr(config, f, False) for f in _FLAGS):
            return False
        if _module._global_forward_hooks or _module._global_forward_pre_hooks:
            return False
        if any(self.hook_dicts):
            return False
        if torch.compiler.is_compiling():  # transformers' forward is what compile is tested on
            return False
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict) and self.layer_types is None:
            return False
        masks = mask.values() if isinstance(mask, dict) else (mask,)
        return all(m is None or isinstance(m, torch.Tensor) and m.ndim == 2 for m in masks)

    def forward(self, cache: Any, return_dict: bool | None = None, **kwargs: Any):
        replayed = self.replay is not None and cache is not None  # where a step is a decode step
        rows, pos, masks, batch, q_len = self._inputs(cache, replayed, **kwargs)
        if q_len == 1 and replayed:  # a decode step
            x = self.replay.step(cache, rows, pos, masks, batch)
        else:
            x = self.layers_forward(rows.contiguous(), pos, masks, cache, batch, q_len)
        out = self.output(last_hidden_state=x.view(batch, q_len, -1), **{self.cache_field: cache})
        return out.to_tuple() if return_dict is False else out

    def decode_logits(self, head: nn.Linear, kwargs: dict) -> tuple[torch.Tensor, TileopsCache] | None:
        """A causal LM's decode step (``planning/enable.py``): its forward's keyword arguments ->
        (logits ``[B, 1, vocab]``, the cache), the layers and ``head`` replayed as one graph
        (``DecodeReplay``); None where the call is not such a step (transformers' forward
        then runs it). Its logits are the bits of transformers' forward, whose ``lm_head``
        runs the same GEMM on the same rows."""
        kw = dict(kwargs)
        cache = pop_cache(kw)
        keep = kw.pop("logits_to_keep", 0)  # any int keeps the one position of a decode step
        ids = kw.get("input_ids")
        if (
            self.replay is None
            or not isinstance(cache, TileopsCache)
            or cache.paged is None
            or ids is None
            or ids.ndim != 2
            or ids.shape[1] != 1
            or kw.get("inputs_embeds") is not None
            or type(keep) is not int
            or kw.pop("labels", None) is not None
            or kw.get("use_cache") is False
            or kw.pop("return_dict", None) is False
            or head._forward_hooks
            or head._forward_pre_hooks
            or not self.accepts(kw)
        ):
            return None
        rows, pos, masks, batch, _ = self._inputs(cache, True, **kw)
        return self.replay.step(cache, rows, pos, masks, batch, head).view(batch, 1, -1), cache

    def _inputs(
        self,
        cache: Any,
        for_replay: bool,
        input_ids: torch.Tensor | None = None,
        attention_mask: Any = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
        **_flags: Any,
    ):
        """(rows ``[B * S, hidden]`` of the embeddings, positions ``[B * S]``, each layer's
        padding mask, B, S). ``for_replay``: a decode step that embeds its ids itself
        (``step_embeds``) gets its ids ``[B]`` in place of the rows."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        given = input_ids if inputs_embeds is None else inputs_embeds
        batch, q_len = given.shape[:2]
        if for_replay and q_len == 1 and inputs_embeds is None and self.step_embeds:
            h = input_ids.reshape(batch).contiguous()
        else:
            h = self.base.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
            if self.embedding_multiplier != 1.0:
                h = h * self.embedding_multiplier
            h = h.reshape(batch * q_len, -1)
        if position_ids is None:
            if cache_position is not None:
                position_ids = cache_position.unsqueeze(0)
            else:
                past = cache.get_seq_length() if cache is not None else 0
                position_ids = (torch.arange(q_len, device=given.device) + past).unsqueeze(0)
        masks = self._masks(attention_mask, q_len)
        attn = self.layers[0].self_attn
        attn._tileops.positions.new_forward()
        pos = positions_of(attn, position_ids, batch, q_len)  # one check for all layers
        return h, pos, masks, batch, q_len

    def layers_forward(
        self,
        residual: torch.Tensor,
        pos: torch.Tensor,
        masks: list[torch.Tensor | None],
        cache: Any,
        batch: int,
        q_len: int,
    ) -> torch.Tensor:
        """The decoder layers and the final norm on the embeddings as rows ``[B * S, hidden]``."""
        first = self.layers[0]._tileops.before_attention
        x = residual if first is None else rmsnorm_forward(first, residual)
        for i, layer in enumerate(self.layers):
            st, attn = layer._tileops, layer.self_attn
            a = linear_rows(attn.o_proj, attention_rows(attn, x, batch, q_len, pos, masks[i], cache))
            if st.after_attention is not None:
                a = rmsnorm_forward(st.after_attention, a)
            x, residual = st.mid(a, residual)
            if self.gated[i]:
                m = mlp_rows(layer.mlp, x)
            else:  # a sparse MoE block: its own forward routes the tokens, as rows of one sequence
                m = layer.mlp.forward(x.view(1, x.shape[0], -1)).view(x.shape[0], -1)
            if st.after_mlp is not None:
                m = rmsnorm_forward(st.after_mlp, m)
            x, residual = self.joins[i](m, residual)
        return x

    def _masks(self, attention_mask: Any, q_len: int) -> list[torch.Tensor | None]:
        """Each layer's padding mask as tileops attention takes it (None: nothing padded)."""
        if isinstance(attention_mask, dict):  # per layer type, already made by our mask function
            return [attention_mask[t] for t in self.layer_types]
        return [padding_mask(attention_mask, q_len)] * len(self.layers)


def plan_fused_model(base: nn.Module, ops: Any, target: str | None, fused_layers: set[int]) -> FusedModel | None:
    """The fused forward of ``base`` when each of its decoder layers is fused and its final
    norm served; None otherwise."""
    config = base.config
    layers = list(getattr(base, "layers", ()))[: getattr(config, "num_hidden_layers", None)]
    norm = getattr(base, "norm", None)
    if not layers or any(id(layer) not in fused_layers for layer in layers):
        return None
    if norm is None or "_tileops" not in norm.__dict__ or not hasattr(base, "embed_tokens"):
        return None
    gated = []  # per layer: a gated MLP over stacked gate/up (else a sparse MoE block fusion.py found served)
    for layer in layers:  # the pieces the loop calls in their rows forms
        mlp = layer.mlp
        gated.append(
            _served(getattr(mlp, "down_proj", None))
            and getattr(getattr(mlp, "_tileops", None), "gate_up", None) is not None
        )
        if not _served(layer.self_attn.o_proj) or not gated[-1] and "_tileops" in mlp.__dict__:
            return None
    joins = []
    for layer, following in zip(layers, [layer._tileops.before_attention for layer in layers[1:]] + [norm]):
        joins.append(ResidualJoin(following, layer._tileops.scale, ops, target))
    layer_types = getattr(config, "layer_types", None)
    return FusedModel(base, layers, joins, gated, list(layer_types)[: len(layers)] if layer_types else None)


def _served(linear: Any) -> bool:
    return linear is not None and "_tileops" in linear.__dict__


def output_class(module: nn.Module, default: type = BaseModelOutputWithPast) -> type:
    """The output class transformers' forward of ``module`` returns (MoE models have their
    own, with router logits)."""
    made = inspect.signature(type(module).forward).return_annotation
    return made if isinstance(made, type) and issubclass(made, ModelOutput) else default


# ---- the base model's forward ----------------------------------------------------------


def base_model_forward(self: nn.Module, *args: Any, **kwargs: Any):
    """The base model's forward, making a TileopsCache where transformers would make a
    DynamicCache (and replacing an empty one that ``generate`` made)."""
    st = self._tileops
    st.positions.new_forward()
    cache = pop_cache(kwargs)
    use_cache = kwargs.get("use_cache")
    use_cache = self.config.use_cache if use_cache is None else use_cache
    if cache is None and use_cache or cache is not None and not isinstance(cache, TileopsCache) and _empty(cache):
        cache = TileopsCache(config=self.config)
    if st.fused is not None and len(args) <= 1:  # the whole model as one loop (fused/model.py)
        if args:
            kwargs["input_ids"] = args[0]
        if st.fused.accepts(kwargs):
            return st.fused.forward(cache, **kwargs)
        args = (kwargs.pop("input_ids"),) if args else ()
    kwargs[st.cache_kw] = cache
    return st.forward(*args, **kwargs)


def _empty(cache: Any) -> bool:
    try:
        return cache.get_seq_length() == 0
    except Exception:  # noqa: BLE001 - a cache we cannot ask is not ours to replace
        return False
