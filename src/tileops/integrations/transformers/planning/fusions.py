"""The fusions' plan: where every piece of a block is served, its projections are stacked
into one GEMM (``fused.fusion.StackedLinear``) and a decoder layer gets the fused forward
(``fused.fusion.layer_forward``), by the layer's norm layout."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..fused.fusion import ResidualJoin, StackedLinear, layer_forward, weight_attrs
from ..gguf import GgufLinear
from ..int4 import W4A16Linear
from .plan import Plan
from .state import LayerState

__all__ = ["plan_fusions"]

_LINEARS = (nn.Linear, GgufLinear, W4A16Linear)  # the Linear kinds a stack may hold (one kind a stack)


@dataclass(frozen=True)
class LayerNorms:
    """A decoder layer's RMSNorms by role (attribute names; None: the layer has none there)."""

    before_attention: str | None
    after_attention: str | None
    before_mlp: str | None
    after_mlp: str | None


_LAYOUTS = {
    # Llama, Mistral, Qwen2/3, Phi-3, Mixtral, Qwen2-MoE, Granite: a norm before each block
    "pre-norm": LayerNorms("input_layernorm", None, "post_attention_layernorm", None),
    # Gemma 3: a norm before and after each block
    "sandwich": LayerNorms(
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"
    ),
    # OLMo 2: a norm after each block only (its post_attention_layernorm normalises the
    # attention's output, not the residual stream as Llama's does)
    "post-norm": LayerNorms(None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
_NORM_NAMES = {n for layout in _LAYOUTS.values() for n in vars(layout).values() if n is not None}


def _stackable(linears: list[Any], served: dict[int, str]) -> bool:
    """Served Linears of one kind that read one input: plain ones of one dtype, GgufLinears
    of one block type, or W4A16Linears of one group size (rows of blocks, 4-bit codes,
    scales and zeros stack along N as rows do)."""
    kind = type(linears[0]) if linears[0] is not None else None
    if kind not in _LINEARS or not all(type(m) is kind and served.get(id(m)) == "linear" for m in linears):
        return False
    first = linears[0]

    def alike(m: nn.Module) -> bool:
        return all(
            getattr(m, a).dtype == getattr(first, a).dtype and getattr(m, a).device == getattr(first, a).device
            for a in weight_attrs(m)
        )

    return all(
        alike(m)
        and getattr(m, "ggml_type", None) == getattr(first, "ggml_type", None)
        and getattr(m, "group_size", None) == getattr(first, "group_size", None)
        and m.in_features == first.in_features
        and (m.bias is None) == (first.bias is None)
        for m in linears
    )


def plan_fusions(model: nn.Module, plan: Plan, target: str | None) -> None:
    """Adds the fusions to ``plan`` (the states of served modules, and layer patches)."""
    ops = plan.ops
    states = {id(p.module): (p.kind, p.state) for p in plan.patches}
    served = {k: v[0] for k, v in states.items()}

    def gemm(linear: nn.Module) -> Any:  # the GEMM of a stack whose first projection is ``linear``
        if isinstance(linear, GgufLinear):
            return ops.GemmGgufFwdOp(linear.ggml_type, target=target)
        if isinstance(linear, W4A16Linear):
            return ops.GemmW4A16FwdOp(group_size=linear.group_size, target=target)
        return ops.GemmFwdOp(False, True, target=target)

    for name, module in model.named_modules():
        kind, state = states.get(id(module), (None, None))
        if kind == "attention":
            state.qkv = _stacked(
                module, ("q_proj", "k_proj", "v_proj"), "qkv_proj", _qkv_sizes, served, gemm, ops, target
            )
            if state.qkv is not None and state.qkv.owned:
                plan.report.replaced.setdefault("stacked projections", []).append(f"{name}.q_proj/k_proj/v_proj")
        elif kind == "mlp":
            state.gate_up = _stacked(
                module,
                ("gate_proj", "up_proj"),
                "gate_up_proj",
                lambda m: [m.gate_up_proj.out_features // 2] * 2,
                served,
                gemm,
                ops,
                target,
            )
            if state.gate_up is not None and state.gate_up.owned:
                plan.report.replaced.setdefault("stacked projections", []).append(f"{name}.gate_proj/up_proj")
        layout = _layout(module, served)
        if layout is not None:
            norms = {
                role: None if attr is None else getattr(module, attr) for role, attr in vars(_LAYOUTS[layout]).items()
            }
            scale = float(getattr(module, "residual_multiplier", 1.0))  # Granite's
            plan.add(
                "decoder layer",
                module,
                layer_forward,
                LayerState(
                    name,
                    **norms,
                    scale=scale,
                    mid=ResidualJoin(norms["before_mlp"], scale, ops, target),
                    # the scaled add that ends the layer: the op the fused model's join uses
                    scaled_add=None if scale == 1.0 else ops.AddFwdOp(alpha=scale, target=target),
                    signature=inspect.signature(type(module).forward),
                ),
            )


def _stacked(
    module: nn.Module,
    apart: tuple[str, ...],
    together: str,
    sizes: Any,
    served: dict[int, str],
    gemm: Any,
    ops: Any,
    target: str | None,
) -> StackedLinear | None:
    """The projections ``apart`` of ``module`` stacked, or its one projection ``together``
    that the checkpoint stacks already (with ``sizes(module)``), where served; else None."""
    stacked = getattr(module, together, None)
    if stacked is not None:
        if type(stacked) not in _LINEARS or served.get(id(stacked)) != "linear":
            return None
        return StackedLinear([stacked], gemm(stacked), ops.AddFwdOp(target=target), sizes=sizes(module))
    linears = [getattr(module, p, None) for p in apart]
    if not _stackable(linears, served):
        return None
    return StackedLinear(linears, gemm(linears[0]), ops.AddFwdOp(target=target))


def _qkv_sizes(attention: nn.Module) -> list[int]:
    """Phi-3's qkv_proj rows: the query heads', then the key heads', then the value heads'."""
    config, dim = attention.config, attention.head_dim
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return [config.num_attention_heads * dim, kv * dim, kv * dim]


def _layout(module: nn.Module, served: dict[int, str]) -> str | None:
    """The layer layout when every piece of ``module`` (a decoder layer) is served."""
    if served.get(id(getattr(module, "self_attn", None))) != "attention":
        return None
    if not _mlp_served(getattr(module, "mlp", None), served):
        return None
    for layout, norms in _LAYOUTS.items():
        present = {n for n in vars(norms).values() if n is not None}
        if all(served.get(id(getattr(module, n, None))) == "rmsnorm" for n in present):
            if not any(hasattr(module, n) for n in _NORM_NAMES - present):  # the layout is the whole layer
                return layout
    return None


def _mlp_served(mlp: nn.Module | None, served: dict[int, str]) -> bool:
    """A gated MLP that tileops serves, or a sparse MoE block whose router and experts it
    serves (the block's own forward only routes between them)."""
    if served.get(id(mlp)) == "mlp":
        return True
    return (
        served.get(id(getattr(mlp, "gate", None))) == "moe router"
        and served.get(id(getattr(mlp, "experts", None))) == "moe experts"
    )
