"""enable's second pass: where every piece of a block is served, it runs as fewer, larger
tileops ops. A decode step is a few hundred small calls, and each call and each small
GEMM costs more than its arithmetic; these fusions change no result beyond the ops' own
rounding.

- **Projections sharing an input** (an attention's q/k/v, a gated MLP's gate/up) run as
  one GEMM over their weights stacked ``[sum N, K]`` (a GGUF or 4-bit Linear's tensors
  stack along N as rows do). The stacked weight is made once, at enable, and the Linear
  modules' parameters become views into it (same Parameter objects, same values, no second
  copy of the weights; on huge pages where the machine has them, as ``fused/placement.py``
  says); ``disable`` gives each its own storage back.
- **A decoder layer** whose norms, attention and MLP are all served gets a per-instance
  forward in which the residual add and the norm after it are one ``FusedAddRMSNormFwdOp``
  (transformers adds in the model dtype, then normalises the rounded sum; the op does the
  same).

Anything not fully served keeps transformers' own forward for that block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tileops.serving.host_memory import on_huge_pages

from ..gguf import GgufLinear
from ..int4 import W4A16Linear

__all__ = [
    "StackedLinear",
    "ResidualJoin",
    "apply_fusions",
    "undo_fusions",
    "stacked_members",
    "weight_attrs",
    "prepared",
    "stacks",
    "norm_weight",
    "norm_eps",
    "layer_forward",
]


def weight_attrs(linear: nn.Module) -> tuple[str, ...]:
    """The attributes holding a served Linear's weight, in the order its GEMM takes them:
    ``weight``, a GgufLinear's blocks, or a W4A16Linear's codes, scales and zeros."""
    if isinstance(linear, GgufLinear):
        return ("weight_blocks",)
    return W4A16Linear.WEIGHTS if isinstance(linear, W4A16Linear) else ("weight",)


def prepared(gemm: Any, attrs: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A Linear's weight tensors (its ``attrs``) as ``gemm``'s target's kernels read them.
    A W4A16Linear's are named as GemmW4A16FwdOp's inputs and go through
    ``op.prepare_weight`` (upstream's ``repack``) once, here: the tensors themselves where the
    target registered no layout of its own (docs/writing-a-backend.md)."""
    if attrs != W4A16Linear.WEIGHTS:
        return tensors
    return tuple(gemm.prepare_weight(attr, t) for attr, t in zip(attrs, tensors))


class StackedLinear:
    """Projections that read the same input, run as one GEMM. ``__call__(x [M, K])`` returns
    ``[M, sum N]``: each projection's outputs in order; ``parts(x)`` each projection's
    ``[M, N]`` on its own, each a GEMM over its rows of the stacked weight (contiguous).

    Either several Linear modules of one kind, stacked at ``apply`` (the modules' weight
    tensors become views into the stack), or one that the checkpoint already stacks
    (Phi-3's qkv_proj and gate_up_proj) with the sizes of its parts: ``owned`` is False,
    and its weight is the module's own. ``weights`` are the stacked tensors (``weight_attrs``
    of the kind), ``served`` the same as the GEMM reads them (``prepared``)."""

    def __init__(self, linears: list[nn.Module], gemm: Any, add: Any, sizes: list[int] | None = None) -> None:
        self.linears, self.gemm, self.add = linears, gemm, add
        self.owned = sizes is None
        self.sizes = [m.out_features for m in linears] if sizes is None else sizes
        self.attrs = weight_attrs(linears[0])
        self.weights: tuple[torch.Tensor, ...] = ()
        self.served: tuple[torch.Tensor, ...] = ()
        self.bias: torch.Tensor | None = None if self.owned else linears[0].bias
        if not self.owned:
            self._serve(tuple(getattr(linears[0], a) for a in self.attrs))

    @property
    def weight(self) -> torch.Tensor | None:
        """The stacked weight (a W4A16 stack's codes; its scales and zeros follow in ``weights``)."""
        return self.weights[0] if self.weights else None

    def _serve(self, weights: tuple[torch.Tensor, ...]) -> None:
        self.weights, self.served = weights, prepared(self.gemm, self.attrs, weights)
        # a layout of the target's own need not keep a projection's rows together
        self.sliceable = all(s is w for s, w in zip(self.served, self.weights))

    def apply(self) -> None:
        with torch.no_grad():
            stacked = []
            for attr in self.attrs:  # rows of GGML blocks, 4-bit codes, scales, zeros: all stack along N
                whole = on_huge_pages(torch.cat([getattr(m, attr).detach() for m in self.linears]))
                for m, view in zip(self.linears, whole.split(self.sizes)):
                    getattr(m, attr).data = view
                stacked.append(whole)
            self._serve(tuple(stacked))
            if self.linears[0].bias is not None:
                self.bias = torch.cat([m.bias.detach() for m in self.linears])
                for m, view in zip(self.linears, self.bias.split(self.sizes)):
                    m.bias.data = view

    def undo(self) -> None:
        """Every parameter gets its own storage again (a copy of its rows)."""
        with torch.no_grad():
            for m in self.linears:
                for attr in self.attrs:
                    w = getattr(m, attr)
                    w.data = w.data.clone()
                if m.bias is not None:
                    m.bias.data = m.bias.data.clone()
        self.weights = self.served = ()
        self.bias = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gemm(x, *self.served)
        return y if self.bias is None else self.add(y, self.bias)

    def held_ops(self) -> list[Any]:
        return [self.gemm] + ([] if self.bias is None else [self.add])  # the add serves a bias only

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.sliceable:
            return [y.contiguous() for y in self(x).split(self.sizes, dim=-1)]
        outs, start = [], 0
        for n in self.sizes:
            y = self.gemm(x, *(w[start : start + n] for w in self.served))
            outs.append(y if self.bias is None else self.add(y, self.bias[start : start + n]))
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

    def held_ops(self) -> list[Any]:
        return [op for op in (self.add_norm, self.add) if op is not None]

    def __call__(self, branch: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.add_norm is not None:
            return self.add_norm(branch, residual, norm_weight(self.norm))
        total = self.add(residual, branch)
        return (total if self.norm is None else self.norm._tileops.norm(total, norm_weight(self.norm))), total


def norm_weight(norm: nn.Module) -> torch.Tensor:
    """The weight a served RMSNorm's op takes (``1 + w`` made once for Gemma's norms)."""
    weight = norm._tileops.weight
    return norm.weight if weight is None else weight


def norm_eps(norm: nn.Module) -> float:
    """An RMSNorm module's epsilon (transformers names it variance_epsilon or eps)."""
    return float(norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps)


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


def layer_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
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
