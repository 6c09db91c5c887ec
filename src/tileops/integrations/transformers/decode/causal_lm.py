"""A plain causal LM's decode step served whole: its forward goes from the step's input ids
to its logits through ``FusedModel.decode_logits`` (the layers and ``lm_head`` replayed as
one captured graph), skipping transformers' causal LM forward, its base model output and
the ``lm_head`` module call. Any other call runs transformers' forward."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

__all__ = ["PLAIN_CAUSAL_LMS", "causal_lm_forward_like"]


# Causal LMs whose forward is the base model, logits_to_keep's slice and lm_head, and a loss
# only with labels: a decode step of theirs can be served whole (causal_lm_forward_like).
# (Gemma 3 caps its logits after the head, Granite scales them; MoE base models do not replay.)
PLAIN_CAUSAL_LMS = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Phi3ForCausalLM",
    "Olmo2ForCausalLM",
)


def causal_lm_forward_like(cls_forward: Any) -> Any:
    """The causal LM's forward, with the signature of its class's (``generate`` reads it): a
    decode step it can serve whole goes to ``FusedModel.decode_logits`` (the layers and
    lm_head replayed as one graph, none of transformers' module calls and outputs around
    them); any other call to transformers' forward."""

    @functools.wraps(cls_forward)
    def forward(self: nn.Module, *args: Any, **kwargs: Any):
        st = self._tileops
        step = None
        if len(args) <= 1 and not (args and "input_ids" in kwargs):  # input_ids may come first, by position
            step = st.fused.decode_logits(st.head, {"input_ids": args[0], **kwargs} if args else kwargs)
        if step is None:
            return st.forward(*args, **kwargs)
        logits, cache = step
        return st.output(logits=logits, **{st.cache_field: cache})

    return forward
