"""enable's second pass: where every piece of a block is served, it runs as fewer, larger
tileops ops. A decode step is a few hundred small calls, and each call and each small
GEMM costs more than its arithmetic; these fusions change no result beyond the ops' own
rounding.

- **Projections sharing an input** (an attention's q/k/v, a gated MLP's gate/up) run as
  one ``GemmFwdOp`` over their weights stacked ``[sum N, K]``. The stacked weight is made
  once, at enable, and the Linear modules' parameters become views into it (same
  Parameter objects, same values, no second copy of the weights; on huge pages where the
  machine has them, as ``_placement.py`` says); ``disable`` gives each its own storage
  back.
- **A decoder layer** whose norms, attention and MLP are all served gets a per-instance
  forward in which the residual add and the norm after it are one ``FusedAddRMSNormFwdOp``
  (transformers adds in the model dtype, then normalises the rounded sum; the op does the
  same).

Anything not fully served keeps transformers' own forward for that block.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from tileops.serving.host_memory import on_huge_pages

__all__ = ["StackedLinear", "plan_fusions", "apply_fusions", "undo_fusions", "stacked_members", "stacks", "norm_weight",
           "norm_eps"]

# decoder layer attributes: (norm before attention, norm after attention or None,
# norm before the MLP, norm after the MLP or None)
_LAYOUTS = {
    "plain": ("input_layernorm", None, "post_attention_layernorm", None),  # Llama, Mistral, Qwen2/3
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"),  # Gemma 3
}


class StackedLinear:
    """nn.Linear modules that read the same input, run as one GEMM. ``__call__(x [M, K])``
    returns ``[M, sum N]``: each module's outputs in order."""

    def __init__(self, linears: list[nn.Linear], gemm: Any, add: Any) -> None:
        self.linears, self.gemm, self.add = linears, gemm, add
        self.sizes = [m.out_features for m in linears]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def apply(self) -> None:
        with torch.no_grad():
            self.weight = on_huge_pages(torch.cat([m.weight.detach() for m in self.linears]))
            for m, view in zip(self.linears, self.weight.split(self.sizes)):
                m.weight.data = view
            if self.linears[0].bias is not None:
                self.bias = torch.cat([m.bias.detach() for m in self.linears])
                for m, view in zip(self.linears, self.bias.split(self.sizes)):
                    m.bias.data = view

    def undo(self) -> None:
        """Every parameter gets its own storage again (a copy of its rows)."""
        with torch.no_grad():
            for m in self.linears:
                m.weight.data = m.weight.data.clone()
                if m.bias is not None:
                    m.bias.data = m.bias.data.clone()
        self.weight = self.bias = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gemm(x, self.weight)
        return y if self.bias is None else self.add(y, self.bias)


def _stackable(linears: list[Any], served: dict[int, str]) -> bool:
    if not all(type(m) is nn.Linear and served.get(id(m)) == "linear" for m in linears):
        return False
    first = linears[0].weight
    return all(m.weight.dtype == first.dtype and m.weight.device == first.device
               and m.in_features == linears[0].in_features and (m.bias is None) == (linears[0].bias is None)
               for m in linears)


def plan_fusions(model: nn.Module, plan: Any, ops: Any, target: str | None) -> None:
    """Adds the fusions to ``plan`` (the states of served modules, and layer patches)."""
    states = {id(module): (kind, state) for module, kind, state, _ in plan.patches}
    served = {k: v[0] for k, v in states.items()}
    gemm = lambda: ops.GemmFwdOp(False, True, target=target)  # noqa: E731
    for name, module in model.named_modules():
        kind, state = states.get(id(module), (None, None))
        if kind == "attention":
            linears = [getattr(module, p, None) for p in ("q_proj", "k_proj", "v_proj")]
            state.qkv = StackedLinear(linears, gemm(), ops.AddFwdOp(target=target)) if _stackable(linears, served) else None
            if state.qkv is not None:
                plan.report.replaced.setdefault("stacked projections", []).append(f"{name}.q_proj/k_proj/v_proj")
        elif kind == "mlp":
            linears = [getattr(module, p, None) for p in ("gate_proj", "up_proj")]
            state.gate_up = StackedLinear(linears, gemm(), ops.AddFwdOp(target=target)) if _stackable(linears, served) else None
            if state.gate_up is not None:
                plan.report.replaced.setdefault("stacked projections", []).append(f"{name}.gate_proj/up_proj")
        layout = _layout(module, served)
        if layout is not None:
            _, _, norm2, _ = _LAYOUTS[layout]
            norm = getattr(module, norm2)
            plan.add("decoder layer", name, module, _layer_forward, sandwich=layout == "sandwich",
                     add_norm=ops.FusedAddRMSNormFwdOp(norm_eps(norm), target=target), norm2=norm,
                     signature=inspect.signature(type(module).forward))


def norm_weight(norm: nn.Module) -> torch.Tensor:
    """The weight a served RMSNorm's op takes (``1 + w`` made once for Gemma's norms)."""
    weight = norm._tileops.weight
    return norm.weight if weight is None else weight


def norm_eps(norm: nn.Module) -> float:
    """An RMSNorm module's epsilon (transformers names it variance_epsilon or eps)."""
    return float(norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps)


def _layout(module: nn.Module, served: dict[int, str]) -> str | None:
    """The layer layout when every piece of ``module`` (a decoder layer) is served."""
    if served.get(id(getattr(module, "self_attn", None))) != "attention":
        return None
    if not _mlp_served(getattr(module, "mlp", None), served):
        return None
    for layout, names in _LAYOUTS.items():
        present = [n for n in names if n is not None]
        if all(served.get(id(getattr(module, n, None))) == "rmsnorm" for n in present):
            extra = {"pre_feedforward_layernorm", "post_feedforward_layernorm"} - set(present)
            if not any(hasattr(module, n) for n in extra):  # the layout is the whole layer
                return layout
    return None


def _mlp_served(mlp: nn.Module | None, served: dict[int, str]) -> bool:
    """A gated MLP that tileops serves, or a sparse MoE block whose router and experts it
    serves (the block's own forward only routes between them)."""
    if served.get(id(mlp)) == "mlp":
        return True
    return (served.get(id(getattr(mlp, "gate", None))) == "moe router"
            and served.get(id(getattr(mlp, "experts", None))) == "moe experts")


def apply_fusions(model: nn.Module) -> None:
    for stacked in stacks(model):
        stacked.apply()


def undo_fusions(model: nn.Module) -> None:
    for stacked in stacks(model):
        stacked.undo()


def stacked_members(model: nn.Module) -> set[int]:
    """ids of the Linear modules whose weights are views into a stacked weight."""
    return {id(m) for stacked in stacks(model) for m in stacked.linears}


def stacks(model: nn.Module) -> list[StackedLinear]:
    found = []
    for module in model.modules():
        state = module.__dict__.get("_tileops")
        for attr in ("qkv", "gate_up"):
            stacked = getattr(state, attr, None)
            if stacked is not None:
                found.append(stacked)
    return found


def _layer_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A decoder layer on served pieces: transformers' order of operations, with the
    residual add and the following norm as one op."""
    st = self._tileops
    if args:  # positional arguments past hidden_states: name them as the class's forward does
        kwargs = st.signature.bind(self, hidden_states, *args, **kwargs).arguments
        kwargs.pop("self"), kwargs.pop("hidden_states")
        kwargs.update(kwargs.pop("kwargs", {}))
    residual = hidden_states
    h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    if st.sandwich:
        h = self.post_attention_layernorm(h)
    h, residual = st.add_norm(h.contiguous(), residual.contiguous(), norm_weight(st.norm2))
    h = self.mlp(h)
    if st.sandwich:
        h = self.post_feedforward_layernorm(h)
    return residual + h
