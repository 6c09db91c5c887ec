"""Attention layers' plan: the RoPE op, window, scale, q/k norms and the attention ops
each layer calls (made per shape on first use), and the check of positions against the
RoPE tables."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..cache import PAGE_SIZE
from ..fused import forwards
from .plan import Plan
from .positions import PositionCheck
from .rope import rope_op, rope_params
from .state import AttentionState, OpMemo

__all__ = ["plan_attention"]

# attention classes that take their window from the config (the others keep it as
# module.sliding_window, set on their sliding layers only)
WINDOW_FROM_CONFIG = {"MistralAttention", "Phi3Attention", "MixtralAttention"}


def plan_attention(model: nn.Module, config: Any, plan: Plan) -> None:
    attentions = [(n, m) for n, m in model.named_modules() if n.endswith("self_attn")]
    ops = plan.ops
    if getattr(config, "use_bidirectional_attention", False):
        plan.refuse("attention", "bidirectional attention", "config use_bidirectional_attention=True")
        return
    staged = []
    positions = plan.positions = PositionCheck(int(config.max_position_embeddings))  # one for every layer
    for name, module in attentions:
        rope, gain = rope_op(config, module, name, plan)
        if rope is None:
            return  # every attention layer stays on torch: the config names one implementation
        window = getattr(module, "sliding_window", None)
        if window is None and type(module).__name__ in WINDOW_FROM_CONFIG:
            window = getattr(config, "sliding_window", None)
        # None of the served architectures' attention applies a logit softcap in transformers
        # (Gemma 3 keeps attn_logit_softcapping in its config but never passes it), so neither
        # does ours; tileops_attention honours softcap= for a caller that passes one.
        softcap = None
        # q/k norms per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)
        qk_norm = (
            None
            if not hasattr(module, "q_norm")
            else ("head" if module.q_norm.weight.numel() == module.head_dim else "projection")
        )
        staged.append(
            (
                module,
                AttentionState(
                    name,
                    rope=rope,
                    window=window,
                    softcap=softcap,
                    scaling=module.scaling * gain * gain,
                    qk_norm=qk_norm,
                    rope_gain=gain,
                    positions=positions,
                    rope_type=rope_params(config, module).get("rope_type", "default"),
                    prefill=OpMemo(
                        ops.GroupedQueryAttentionPrefillFwdOp,
                        lambda mq, mk, s, c, w: ops.GroupedQueryAttentionPrefillFwdOp(
                            mq, mk, True, s, c, w, -1, target=plan.target
                        ),
                    ),
                    paged=OpMemo(
                        ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp,
                        lambda width, mq, s, c, w: ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(
                            width, PAGE_SIZE, mq, True, s, c, w, target=plan.target
                        ),
                    ),
                ),
            )
        )
    for module, state in staged:
        plan.add("attention", module, forwards.attention_forward, state)
