"""vLLM's unquantized MoE experts on ``FusedMoeFwdOp``.

A ``FusedMoE`` layer's experts run through its quant method; an unquantized layer makes
vLLM's ``UnquantizedFusedMoEMethod`` (a ``CustomOp``, so ``register_oot`` puts the subclass
here in its place). vLLM's router picks each token's experts and weights first and hands
them to ``apply``; they reach ``FusedMoeFwdOp`` as logits that select exactly those experts
with those weights (``tileops.integrations.routing``), so the routing stays vLLM's own and
only the experts' products and their weighted sum run on tileops.

A served layer keeps its weights as loaded ([E, 2F, H] gate rows then up rows, [E, H, F]):
vLLM's CPU path would repack them for its grouped GEMM, which is skipped. Shared experts,
where a model has them, are a separate module vLLM runs itself before the routed ones.
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from ... import ops
from ..routing import routing_as_logits
from . import report

__all__ = ["register"]

_NAME = "UnquantizedFusedMoEMethod"
_DTYPES = (torch.float16, torch.bfloat16)
_ACTIVATIONS = {MoEActivation.SILU: "silu_and_mul", MoEActivation.GELU: "gelu_and_mul"}
_SCORINGS = ("softmax", "sigmoid")  # their weights are in [0, 1], as routing_as_logits needs


def _refusal(layer: torch.nn.Module) -> str | None:
    """Why ``FusedMoeFwdOp`` cannot run this layer's experts exactly, or None."""
    w13, w2 = layer.w13_weight, layer.w2_weight
    if w13.dtype not in _DTYPES:
        return f"{w13.dtype} experts (FusedMoeFwdOp takes float16 | bfloat16)"
    if layer.activation not in _ACTIVATIONS:
        return f"activation {layer.activation.value} (FusedMoeFwdOp takes silu or gelu, gated)"
    if layer.expert_map is not None:
        return "expert parallelism (an expert map)"
    if getattr(layer, "w13_bias", None) is not None:
        return "expert biases"
    if layer.apply_router_weight_on_input:
        return "router weights applied to the input"
    if layer.custom_routing_function is not None or layer.scoring_func not in _SCORINGS:
        return "a router whose weights may leave [0, 1]"
    if layer.routed_scaling_factor != 1.0:
        return f"routed_scaling_factor {layer.routed_scaling_factor}"
    if any(getattr(layer, name, None) is not None for name in ("swiglu_limit", "swiglu_alpha", "swiglu_beta")):
        return "a clamped or scaled SwiGLU"
    if w13.shape[1] != 2 * w2.shape[2] or w13.shape[2] != w2.shape[1]:
        return f"experts of shapes {tuple(w13.shape)} and {tuple(w2.shape)} (not [E, 2F, H] and [E, H, F])"
    return None


def _max_tokens() -> int:
    """The most tokens one engine step brings (the op is built for them once: the layer
    may run under torch.compile, where nothing is built per call)."""
    config = get_current_vllm_config_or_none()
    if config is None:
        raise RuntimeError("tileops' MoE layer was built outside a vLLM engine (no current vLLM config)")
    return int(config.scheduler_config.max_num_batched_tokens)


class TileopsFusedMoEMethod(UnquantizedFusedMoEMethod):
    """``apply`` on ``FusedMoeFwdOp``, or vLLM's own for a layer it cannot serve."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._op = None
        self._max_tokens = _max_tokens()

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        why = _refusal(layer)
        if why:
            report.kept(_NAME, why)
            super().process_weights_after_loading(layer)
            return
        experts, ffn2, hidden = layer.w13_weight.shape
        self._op = ops.FusedMoeFwdOp(
            num_tokens=self._max_tokens,
            num_experts=experts,
            top_k=layer.top_k,
            hidden_size=hidden,
            ffn_size=ffn2 // 2,
            scoring_func="sigmoid",  # the routing arrives as logits (routing_as_logits)
            activation=_ACTIVATIONS[layer.activation],
        )
        report.served(_NAME)

    @property
    def is_monolithic(self) -> bool:  # vLLM routes first, then calls apply
        return False if self._op is not None else super().is_monolithic

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        if self._op is None:
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        # vLLM ran the shared experts itself (no kernel of its own here to overlap them with)
        gating = routing_as_logits(topk_ids, topk_weights, layer.w13_weight.shape[0], check=False)
        # .data: the op's plain-tensor path, as for the linear layers
        return self._op(x.contiguous(), gating, layer.w13_weight.data, layer.w2_weight.data, None)


def register() -> None:
    CustomOp.register_oot(TileopsFusedMoEMethod, name=_NAME)
