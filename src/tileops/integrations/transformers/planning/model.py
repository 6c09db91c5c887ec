"""What ``enable`` serves of a model: the architectures, and the walk over its modules
(Linear, RMSNorm, gated MLP here; attention in ``attention.py``, MoE blocks in ``moe.py``).

What is served is decided up front, from the config and the module types; anything that
cannot be served exactly is refused (``UnsupportedModelError``, naming the module, the
feature and the config value) or, with ``strict=False``, left on torch and listed in the
report. Nothing is guessed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..fused import forwards
from ..fused.fusion import norm_eps, prepared, weight_attrs
from ..gguf import GgufEmbedding, GgufLinear
from ..int4 import W4A16Linear
from .attention import plan_attention
from .moe import plan_moe
from .plan import Plan
from .report import UnsupportedModelError
from .state import EmbeddingState, LinearState, MlpState, NormState

__all__ = ["SUPPORTED_ARCHITECTURES", "plan_model"]

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "GraniteForCausalLM",
    "Olmo2ForCausalLM",
)
_GATED_ACTS = {"silu": "SiluAndMulFwdOp", "gelu_pytorch_tanh": "GeluTanhAndMulFwdOp"}
_RMSNORMS = {  # class name -> the weight is used as w (False) or as 1 + w (True)
    "LlamaRMSNorm": False,
    "MistralRMSNorm": False,
    "Qwen2RMSNorm": False,
    "Qwen3RMSNorm": False,
    "Qwen3MoeRMSNorm": False,
    "Gemma3RMSNorm": True,
    "Phi3RMSNorm": False,
    "MixtralRMSNorm": False,
    "Qwen2MoeRMSNorm": False,
    "GraniteRMSNorm": False,
    "Olmo2RMSNorm": False,
}
_HALF = (torch.float16, torch.bfloat16)


def plan_model(model: nn.Module, strict: bool, target: str | None) -> Plan:
    """What can be served of ``model`` and how: the plan ``enable`` applies."""
    plan = Plan(model, strict, target)
    arch = type(model).__name__
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"tileops cannot serve {arch}: architecture (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if model.training:
        raise UnsupportedModelError(
            f"tileops cannot serve {arch} in training mode: it is inference only (model.eval())"
        )
    dtype = next(model.parameters()).dtype
    if dtype not in _HALF:
        raise UnsupportedModelError(
            f"tileops cannot serve {arch} in {dtype}: tileops' GEMM and attention kernels serve float16 and bfloat16; "
            "load the model with torch_dtype=torch.bfloat16 (dtype= in transformers 5), or call "
            "model.to(torch.bfloat16)"
        )
    if getattr(model, "_tileops_enabled", False):
        raise UnsupportedModelError(
            f"{arch} is already enabled (tileops.integrations.transformers.disable(model) first)"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    ops = plan.ops

    plan_attention(model, config, plan)
    plan_moe(model, config, plan)

    act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    for name, module in model.named_modules():
        cls = type(module).__name__
        if type(module) in (nn.Linear, GgufLinear, W4A16Linear):
            if type(module) is nn.Linear and module.weight.dtype not in _HALF:
                plan.refuse(name, "Linear", f"weight dtype {module.weight.dtype}")
                continue
            plan.add("linear", module, forwards.linear_forward, _linear_state(name, module, ops, target))
        elif type(module) is GgufEmbedding:
            plan.add(
                "embedding",
                module,
                forwards.embedding_forward,
                EmbeddingState(
                    name,
                    lookup=ops.EmbeddingGgufFwdOp(
                        module.ggml_type, str(module.dtype).removeprefix("torch."), target=target
                    ),
                ),
            )
        elif cls.endswith("RMSNorm"):
            if cls not in _RMSNORMS:
                plan.refuse(name, f"{cls}", "an RMSNorm class whose weight convention tileops does not know")
                continue
            weight = (1.0 + module.weight.float()).to(module.weight.dtype) if _RMSNORMS[cls] else None
            plan.add(
                "rmsnorm",
                module,
                forwards.rmsnorm_forward,
                NormState(
                    name,
                    norm=ops.RMSNormFwdOp((module.weight.shape[0],), norm_eps(module), target=target),
                    weight=weight,
                ),
            )
        elif (
            cls.endswith("MLP")
            and hasattr(module, "down_proj")
            and (all(hasattr(module, p) for p in ("gate_proj", "up_proj")) or hasattr(module, "gate_up_proj"))
        ):
            if act_name not in _GATED_ACTS:
                plan.refuse(name, "gated MLP", f"config hidden_act={act_name!r} (served: {', '.join(_GATED_ACTS)})")
                continue
            plan.add(
                "mlp",
                module,
                forwards.mlp_forward,
                MlpState(name, act=getattr(ops, _GATED_ACTS[act_name])(target=target)),
            )
    for attr, where, what in (
        ("embedding_multiplier", "embed_tokens", "its output times"),
        ("logits_scaling", "lm_head", "its logits divided by"),
    ):  # Granite's
        if float(getattr(config, attr, 1.0) or 1.0) != 1.0:
            plan.report.on_torch.append((where, attr.replace("_", " "), f"{what} {getattr(config, attr)}, in torch"))
    if getattr(config, "final_logit_softcapping", None):
        plan.report.on_torch.append(
            ("lm_head", "final logit softcapping", f"{config.final_logit_softcapping} (torch.tanh)")
        )
    if not isinstance(model.get_input_embeddings(), GgufEmbedding):
        plan.report.on_torch.append(("embed_tokens", "embedding lookup", "torch's: a row copy, no tileops op"))
    plan.report.on_torch.append(
        (
            "decoder layers",
            "residual adds",
            "torch adds, but for the one after attention in a fused decoder layer (FusedAddRMSNormFwdOp)",
        )
    )
    return plan


def _linear_state(name: str, module: nn.Module, ops: Any, target: str | None) -> LinearState:
    """A served Linear's state: its GEMM by the kind of its weight (dense; a GGUF
    checkpoint's blocks, ..gguf; a GPTQ or AWQ checkpoint's 4-bit groups, ..int4, prepared
    once in the target's own layout where it has one)."""
    add, has_bias = ops.AddFwdOp(target=target), module.bias is not None
    if type(module) is nn.Linear:
        return LinearState(name, gemm=ops.GemmFwdOp(False, True, target=target), add=add, has_bias=has_bias)
    if type(module) is GgufLinear:
        gemm = ops.GemmGgufFwdOp(module.ggml_type, target=target)
        return LinearState(name, gemm=gemm, add=add, has_bias=has_bias, weight_attrs=weight_attrs(module))
    gemm = ops.GemmW4A16FwdOp(group_size=module.group_size, target=target)
    own = tuple(getattr(module, a) for a in module.WEIGHTS)
    served = prepared(gemm, module.WEIGHTS, own)
    return LinearState(
        name,
        gemm=gemm,
        add=add,
        has_bias=has_bias,
        weight_attrs=module.WEIGHTS,
        prepared=None if all(s is t for s, t in zip(served, own)) else served,
    )
