"""Mixture-of-experts blocks' plan: which sparse blocks, routers and experts are served
(their forwards are ``..moe``), and what is refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import nn

from ..moe import ExpertsInterface, _default_apply_gate, router_forward
from .plan import Plan
from .state import ExpertsState, OpMemo, RouterState

__all__ = ["plan_moe"]


@dataclass(frozen=True)
class _RouterRule:
    """What a router's forward computes after its logits: softmax in float32, top-k, then
    renormalisation over the k (always, or as its ``norm_topk_prob`` says) and the weights
    cast to the logits' dtype or kept in float32."""

    always_renormalize: bool
    weights_in_logits_dtype: bool


# only routers known to compute exactly that are served
_ROUTERS = {
    "Qwen3MoeTopKRouter": _RouterRule(always_renormalize=False, weights_in_logits_dtype=True),
    "Qwen2MoeTopKRouter": _RouterRule(always_renormalize=False, weights_in_logits_dtype=True),
    "MixtralTopKRouter": _RouterRule(always_renormalize=True, weights_in_logits_dtype=False),
}
# sparse blocks -> what they hold beside the router and the experts (each served as any
# module of its kind is); the block's own forward combines them
_BLOCKS = {
    "Qwen3MoeSparseMoeBlock": (),
    "MixtralSparseMoeBlock": (),
    "Qwen2MoeSparseMoeBlock": ("shared_expert", "shared_expert_gate"),  # a gated MLP and its sigmoid gate
}
_ACTS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul"}  # the experts' act_fn -> FusedMoeFwdOp activation


def plan_moe(model: nn.Module, config: Any, plan: Plan) -> None:
    """Adds the router and experts of every sparse MoE block to ``plan``, or refuses them."""
    target, ops = plan.target, plan.ops
    for name, block in model.named_modules():
        cls = type(block).__name__
        if not cls.endswith("SparseMoeBlock"):
            continue
        if cls not in _BLOCKS:
            plan.refuse(name, "mixture-of-experts block", f"{cls}: a block whose pieces tileops does not know")
            continue
        router, experts = block.gate, block.experts
        rcls = type(router).__name__
        if rcls not in _ROUTERS:
            plan.refuse(f"{name}.gate", "MoE router", f"{rcls}: a router whose rule tileops does not know")
            plan.report.on_torch.append((f"{name}.experts", "MoE experts", "kept on torch with their router"))
            continue
        why = _experts_unserved(experts, config)
        if why is None and experts.gate_up_proj.dtype not in (torch.float16, torch.bfloat16):
            why = f"weight dtype {experts.gate_up_proj.dtype}"
        if why:
            plan.refuse(f"{name}.experts", "MoE experts", why)
            plan.report.on_torch.append((f"{name}.gate", "MoE router", "kept on torch with its experts"))
            continue
        num_experts, top_k = int(router.num_experts), int(router.top_k)
        hidden, ffn = int(experts.hidden_dim), int(experts.intermediate_dim)
        rule = _ROUTERS[rcls]
        renormalize = rule.always_renormalize or bool(router.norm_topk_prob)
        act = _ACTS[config.hidden_act]
        if _BLOCKS[cls]:
            plan.report.on_torch.append(
                (
                    name,
                    "the shared expert's sigmoid gate and weighted add",
                    "torch (the shared expert and its gate's projection run on tileops)",
                )
            )
        plan.add(
            "moe router",
            router,
            router_forward,
            RouterState(
                f"{name}.gate",
                renormalize=renormalize,
                weights_in_logits_dtype=rule.weights_in_logits_dtype,
                gemm=ops.GemmFwdOp(False, True, target=target),
                topk=ops.FusedTopKOp(
                    num_experts=num_experts, top_k=top_k, scoring_func="softmax", renormalize=renormalize, target=target
                ),
            ),
        )
        plan.add(
            "moe experts",
            experts,
            None,
            ExpertsState(
                f"{name}.experts",
                num_experts=num_experts,
                moe=OpMemo(
                    ops.FusedMoeFwdOp,
                    lambda tokens, e=num_experts, k=top_k, h=hidden, f=ffn, a=act: ops.FusedMoeFwdOp(
                        tokens, e, k, h, f, "sigmoid", False, 1.0, activation=a, target=target
                    ),
                ),
            ),
        )
    if plan.report.count("moe router"):
        plan.report.on_torch.append(
            (
                "MoE routers",
                "a tie at the k-th place",
                "a token whose k-th logit equals a left-out expert's is ranked by torch.topk, as transformers ranks it",
            )
        )


def _experts_unserved(experts: nn.Module, config: Any) -> str | None:
    """Why an experts module cannot run as FusedMoeFwdOp, or None."""
    if ExpertsInterface is None or not hasattr(experts, "has_gate"):
        return (
            f"{type(experts).__name__} does not dispatch through transformers' ExpertsInterface "
            f"(transformers {transformers.__version__})"
        )
    layout = {
        "has_gate": True,
        "has_bias": False,
        "is_transposed": False,
        "is_concatenated": True,
        "has_post_expert_norm": False,
        "_is_expert_parallel": False,
    }
    for attr, want in layout.items():
        if bool(getattr(experts, attr, want)) != want:
            return (
                f"{attr}={not want} (served: gate_up [E, 2F, H] gate then up, no bias, no post-expert norm, "
                "one process)"
            )
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is not None and gate is not _default_apply_gate:
        return f"{type(experts).__name__} has its own gating (_apply_gate)"
    act = getattr(config, "hidden_act", None)
    if act not in _ACTS:
        return f"config hidden_act={act!r} (served: {', '.join(_ACTS)})"
    if getattr(experts, "num_experts", None) is None or tuple(experts.gate_up_proj.shape) != (
        experts.num_experts,
        2 * experts.intermediate_dim,
        experts.hidden_dim,
    ):
        return f"gate_up_proj of shape {tuple(experts.gate_up_proj.shape)}"
    return None
