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
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tileops.serving.host_memory import on_huge_pages

__all__ = ["StackedLinear", "ResidualJoin", "plan_fusions", "apply_fusions", "undo_fusions", "stacked_members",
           "stacks", "norm_weight", "norm_eps", "layer_norms"]


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
    "sandwich": LayerNorms("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"),
    # OLMo 2: a norm after each block only (its post_attention_layernorm normalises the
    # attention's output, not the residual stream as Llama's does)
    "post-norm": LayerNorms(None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
_NORM_NAMES = {n for layout in _LAYOUTS.values() for n in vars(layout).values() if n is not None}


class StackedLinear:
    """Projections that read the same input, run as one GEMM. ``__call__(x [M, K])`` returns
    ``[M, sum N]``: each projection's outputs in order; ``parts(x)`` each projection's
    ``[M, N]`` on its own, each a GEMM over its rows of the stacked weight (contiguous).

    Either several nn.Linear modules, stacked at ``apply`` (the modules' parameters become
    views into the stack), or one nn.Linear that the checkpoint already stacks (Phi-3's
    qkv_proj and gate_up_proj) with the sizes of its parts: ``owned`` is False, and its
    weight is the module's own parameter."""

    def __init__(self, linears: list[nn.Linear], gemm: Any, add: Any, sizes: list[int] | None = None) -> None:
        self.linears, self.gemm, self.add = linears, gemm, add
        self.owned = sizes is None
        self.sizes = [m.out_features for m in linears] if sizes is None else sizes
        self.weight: torch.Tensor | None = None if self.owned else linears[0].weight
        self.bias: torch.Tensor | None = None if self.owned else linears[0].bias

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

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs, start = [], 0
        for n in self.sizes:
            y = self.gemm(x, self.weight[start:start + n])
            outs.append(y if self.bias is None else self.add(y, self.bias[start:start + n]))
            start += n
        return outs


class ResidualJoin:
    """A residual add and the RMSNorm that reads its sum: ``(branch, residual) -> (the
    norm of the sum, the sum)``, with the branch scaled first (Granite's
    residual_multiplier). Without a norm (``norm`` None: the next block reads the sum
    itself, as OLMo 2's layers do) the sum is both. Unscaled and normed, it is one
    ``FusedAddRMSNormFwdOp`` (it rounds the sum to the model dtype before normalising, as
    transformers does); otherwise ``AddFwdOp`` (alpha = the scale) and the norm's own op."""

    def __init__(self, norm: nn.Module | None, scale: float, ops: Any, target: str | None) -> None:
        self.norm, self.scale = norm, scale
        fused = norm is not None and scale == 1.0
        self.add_norm = ops.FusedAddRMSNormFwdOp(norm_eps(norm), target=target) if fused else None
        self.add = None if fused else ops.AddFwdOp(alpha=scale, target=target)

    def __call__(self, branch: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.add_norm is not None:
            return self.add_norm(branch, residual, norm_weight(self.norm))
        total = self.add(residual, branch)
        return (total if self.norm is None else self.norm._tileops.norm(total, norm_weight(self.norm))), total


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
            state.qkv = _stacked(module, ("q_proj", "k_proj", "v_proj"), "qkv_proj", _qkv_sizes, served, gemm, ops, target)
            if state.qkv is not None and state.qkv.owned:
                plan.report.replaced.setdefault("stacked projections", []).append(f"{name}.q_proj/k_proj/v_proj")
        elif kind == "mlp":
            state.gate_up = _stacked(module, ("gate_proj", "up_proj"), "gate_up_proj",
                                     lambda m: [m.gate_up_proj.out_features // 2] * 2, served, gemm, ops, target)
            if state.gate_up is not None and state.gate_up.owned:
                plan.report.replaced.setdefault("stacked projections", []).append(f"{name}.gate_proj/up_proj")
        layout = _layout(module, served)
        if layout is not None:
            norms = {role: None if attr is None else getattr(module, attr) for role, attr in vars(_LAYOUTS[layout]).items()}
            scale = float(getattr(module, "residual_multiplier", 1.0))  # Granite's
            plan.add("decoder layer", name, module, _layer_forward, **norms, scale=scale,
                     mid=ResidualJoin(norms["before_mlp"], scale, ops, target),
                     # the scaled add that ends the layer: the op the fused model's join uses
                     scaled_add=None if scale == 1.0 else ops.AddFwdOp(alpha=scale, target=target),
                     signature=inspect.signature(type(module).forward))


def _stacked(module: nn.Module, apart: tuple[str, ...], together: str, sizes: Any, served: dict[int, str], gemm: Any,
             ops: Any, target: str | None) -> StackedLinear | None:
    """The projections ``apart`` of ``module`` stacked, or its one projection ``together``
    that the checkpoint stacks already (with ``sizes(module)``), where served; else None."""
    stacked = getattr(module, together, None)
    if stacked is not None:
        if type(stacked) is not nn.Linear or served.get(id(stacked)) != "linear":
            return None
        return StackedLinear([stacked], gemm(), ops.AddFwdOp(target=target), sizes=sizes(module))
    linears = [getattr(module, p, None) for p in apart]
    return StackedLinear(linears, gemm(), ops.AddFwdOp(target=target)) if _stackable(linears, served) else None


def _qkv_sizes(attention: nn.Module) -> list[int]:
    """Phi-3's qkv_proj rows: the query heads', then the key heads', then the value heads'."""
    config, dim = attention.config, attention.head_dim
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return [config.num_attention_heads * dim, kv * dim, kv * dim]


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
    return (served.get(id(getattr(mlp, "gate", None))) == "moe router"
            and served.get(id(getattr(mlp, "experts", None))) == "moe experts")


def apply_fusions(model: nn.Module) -> None:
    for stacked in stacks(model):
        stacked.apply()


def undo_fusions(model: nn.Module) -> None:
    for stacked in stacks(model):
        stacked.undo()


def stacked_members(model: nn.Module) -> set[int]:
    """ids of the Linear modules whose weights are views into a stack made at enable."""
    return {id(m) for stacked in stacks(model) for m in stacked.linears}


def stacks(model: nn.Module) -> list[StackedLinear]:
    """The stacks made at enable (not those of a checkpoint's own stacked projections)."""
    found = []
    for module in model.modules():
        state = module.__dict__.get("_tileops")
        for attr in ("qkv", "gate_up"):
            stacked = getattr(state, attr, None)
            if stacked is not None and stacked.owned:
                found.append(stacked)
    return found


def _layer_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A decoder layer on served pieces: transformers' order of operations, with the
    residual add after attention and the norm after it as one join (``ResidualJoin``)."""
    st = self._tileops
    if args:  # positional arguments past hidden_states: name them as the class's forward does
        kwargs = st.signature.bind(self, hidden_states, *args, **kwargs).arguments
        kwargs.pop("self"), kwargs.pop("hidden_states")
        kwargs.update(kwargs.pop("kwargs", {}))
    residual = hidden_states
    x = hidden_states if st.before_attention is None else st.before_attention(hidden_states)
    h, _ = self.self_attn(hidden_states=x, **kwargs)
    if st.after_attention is not None:
        h = st.after_attention(h)
    h, residual = st.mid(h.contiguous(), residual.contiguous())
    h = self.mlp(h)
    if st.after_mlp is not None:
        h = st.after_mlp(h)
    return residual + h if st.scaled_add is None else st.scaled_add(residual.contiguous(), h.contiguous())
