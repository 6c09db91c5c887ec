"""What ``enable`` leaves on each module it serves (``module._tileops``): one dataclass per
kind of module, holding the ops its forward calls and what they need. ``ops()`` lists the
op instances a state holds and ``op_names()`` the op classes it calls (with those its
``OpMemo``s make on first use), so nothing has to search a state to find them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..fused.fusion import ResidualJoin, StackedLinear
    from ..fused.model import FusedModel
    from .positions import PositionCheck

__all__ = [
    "OpMemo",
    "ModuleState",
    "LinearState",
    "EmbeddingState",
    "NormState",
    "MlpState",
    "AttentionState",
    "LayerState",
    "RouterState",
    "ExpertsState",
    "BaseModelState",
    "CausalLMState",
    "state_of",
]


class OpMemo:
    """One op of class ``op`` per distinct key, made on first use by ``make(*key)`` (ops
    memoize their kernels per instance, so calls with the same params share one)."""

    def __init__(self, op: type, make: Callable[..., Any]) -> None:
        self.op, self.make = op, make
        self.made: dict[tuple, Any] = {}

    def __call__(self, *key: Any) -> Any:
        if key not in self.made:
            self.made[key] = self.make(*key)
        return self.made[key]


def _is_op(value: Any) -> bool:
    from tileops.ops.op import Op  # noqa: PLC0415 - the op layer loads on first enable

    return isinstance(value, Op)


@dataclass
class ModuleState:
    """The common part: the module's name in the model."""

    name: str

    def ops(self) -> Iterator[Any]:
        """The op instances this state holds (those its memos made so far included)."""
        for f in fields(self):
            yield from _ops_in(getattr(self, f.name))

    def op_names(self) -> list[str]:
        """The op classes this module's forward calls, in field order."""
        names: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, OpMemo):
                names.append(value.op.__name__)
            else:
                names += [type(op).__name__ for op in _ops_in(value)]
        return list(dict.fromkeys(names))


def _ops_in(value: Any) -> Iterator[Any]:
    if _is_op(value):
        yield value
    elif isinstance(value, OpMemo):
        yield from value.made.values()
    elif hasattr(value, "held_ops"):  # a stacked projection, a residual join, a LongRoPE pair
        yield from value.held_ops()


@dataclass
class LinearState(ModuleState):
    gemm: Any  # GemmFwdOp, GemmGgufFwdOp over a GgufLinear's blocks, or GemmW4A16FwdOp over a W4A16Linear's
    add: Any  # adds its bias
    has_bias: bool
    weight_attrs: tuple[str, ...] = ("weight",)  # the module's tensors the GEMM reads after x (fusion.weight_attrs)
    # those tensors in a layout of the target's own (fusion.prepared), made once; None: the module's own
    prepared: tuple[torch.Tensor, ...] | None = None

    def op_names(self) -> list[str]:
        return [type(self.gemm).__name__] + (["AddFwdOp"] if self.has_bias else [])


@dataclass
class EmbeddingState(ModuleState):
    """A GgufEmbedding's: its rows looked up in the blocks by ``EmbeddingGgufFwdOp``."""

    lookup: Any


@dataclass
class NormState(ModuleState):
    norm: Any
    weight: torch.Tensor | None  # the weight the op takes where it is not the module's (Gemma's 1 + w)


@dataclass
class MlpState(ModuleState):
    act: Any
    gate_up: StackedLinear | None = None  # gate and up as one GEMM (fused/fusion.py)


@dataclass
class AttentionState(ModuleState):
    rope: Any
    window: int | None
    softcap: float | None
    scaling: float
    qk_norm: str | None  # "head", "projection" or None
    rope_gain: float
    positions: PositionCheck
    rope_type: str
    prefill: OpMemo
    paged: OpMemo
    qkv: StackedLinear | None = None  # q, k and v as one GEMM (fused/fusion.py)


@dataclass
class LayerState(ModuleState):
    """A fused decoder layer: its norms by role, and the joins between its blocks."""

    before_attention: torch.nn.Module | None
    after_attention: torch.nn.Module | None
    before_mlp: torch.nn.Module | None
    after_mlp: torch.nn.Module | None
    scale: float  # Granite's residual_multiplier
    mid: ResidualJoin
    scaled_add: Any  # the scaled residual add that ends the layer, where scale != 1
    signature: inspect.Signature


@dataclass
class RouterState(ModuleState):
    renormalize: bool
    weights_in_logits_dtype: bool
    gemm: Any
    topk: Any


@dataclass
class ExpertsState(ModuleState):
    num_experts: int
    moe: OpMemo


@dataclass
class BaseModelState(ModuleState):
    forward: Callable[..., Any]  # transformers' own
    cache_kw: str
    fused: FusedModel | None
    positions: PositionCheck


@dataclass
class CausalLMState(ModuleState):
    forward: Callable[..., Any]  # transformers' own
    fused: FusedModel
    head: torch.nn.Linear
    output: type
    cache_field: str


def state_of(module: torch.nn.Module) -> ModuleState | None:
    """The state ``enable`` left on ``module``, or None."""
    state = module.__dict__.get("_tileops")
    return state if isinstance(state, ModuleState) else None
