"""vLLM's norm, gated-activation and rotary layers on tileops ops.

Each class subclasses vLLM's layer and is registered under its name
(``CustomOp.register_oot``), so vLLM builds it wherever a model asks for the original. It
keeps the original's constructor and weights; its forward runs the tileops op, or, for an
instance the op cannot serve exactly, the original's own forward (recorded in the report).

vLLM calls ``forward_cpu`` where its custom ops are on (eager mode) and traces
``forward_native`` where they are off (its default torch.compile mode); both are the
tileops path here. Under tracing a tileops op is its ``tileops::`` custom op, opaque to
dynamo. The ops are made in ``__init__``: nothing is constructed inside a traced forward.
"""

from __future__ import annotations

import math

import torch
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.dynamic_ntk_scaling_rope import DynamicNTKScalingRotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.linear_scaling_rope import LinearScalingRotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.llama3_rope import Llama3RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.phi3_long_rope_scaled_rope import Phi3LongRoPEScaledRotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import YaRNScalingRotaryEmbedding

from ... import ops
from ...rope_tables import longrope_factors_for
from . import report

__all__ = ["register"]

_NORM_DTYPES = (torch.float16, torch.bfloat16)


class TileopsRMSNorm(RMSNorm):
    """``RMSNormFwdOp``; with a residual, ``FusedAddRMSNormFwdOp`` (the sum is rounded to
    the model's dtype before it is normalised, as vLLM's own CPU kernel does)."""

    _vllm_name = "RMSNorm"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._norm = self._add_norm = None
        why = None
        if self.variance_size_override is not None:
            why = "variance over part of the hidden size"
        elif self.weight.dtype not in _NORM_DTYPES:
            why = f"{self.weight.dtype} (tileops' norms take float16 | bfloat16)"
        if why:
            report.kept(self._vllm_name, why)
            return
        self._norm = ops.RMSNormFwdOp((self.hidden_size,), self.variance_epsilon)
        self._add_norm = ops.FusedAddRMSNormFwdOp(self.variance_epsilon)
        report.served(self._vllm_name)

    def _tileops(self, x: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            return self._norm(x, self.weight)
        return self._add_norm(x, residual, self.weight)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self._norm is None:
            return super().forward_native(x, residual)
        return self._tileops(x, residual)

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self._norm is None:
            return super().forward_cpu(x, residual)
        return self._tileops(x, residual)


class _TileopsGated:
    """The gated activations' shared forward: ``_op`` over x [..., 2d] as rows [M, 2d] -> [..., d]."""

    _vllm_name: str
    _op = None

    def _tileops(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        return self._op(x.reshape(-1, width)).view(*x.shape[:-1], width // 2)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return self._tileops(x)

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        return self._tileops(x)


class TileopsSiluAndMul(_TileopsGated, SiluAndMul):
    """``SiluAndMulFwdOp``: silu(x[..., :d]) * x[..., d:]."""

    _vllm_name = "SiluAndMul"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._op = ops.SiluAndMulFwdOp()
        report.served(self._vllm_name)


class TileopsGeluAndMul(_TileopsGated, GeluAndMul):
    """``GeluAndMulFwdOp`` (erf) or ``GeluTanhAndMulFwdOp`` (``approximate="tanh"``)."""

    _vllm_name = "GeluAndMul"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._op = ops.GeluTanhAndMulFwdOp() if self.approximate == "tanh" else ops.GeluAndMulFwdOp()
        report.served(self._vllm_name)


def _rope_op(layer: RotaryEmbedding):
    """The position-id RoPE op computing exactly ``layer``'s table, or a reason it cannot."""
    common = dict(rotary_dim=layer.rotary_dim)
    max_position, base = layer.max_position_embeddings, float(layer.base)
    if isinstance(layer, Llama3RotaryEmbedding):
        if not layer.is_neox_style:
            return "Llama 3 scaling on GPT-J pairs"
        return ops.RopeLlama31PositionIdsFwdOp(
            max_position,
            base,
            scale_factor=float(layer.scaling_factor),
            low_freq_factor=float(layer.low_freq_factor),
            high_freq_factor=float(layer.high_freq_factor),
            original_max_position=int(layer.orig_max_position),
            **common,
        )
    if isinstance(layer, LinearScalingRotaryEmbedding):
        # positions divided by the factor = every frequency divided by it (LongRoPE's factors,
        # all equal)
        if len(layer.scaling_factors) != 1:
            return f"{len(layer.scaling_factors)} scaling factors (one cos/sin table each)"
        if not layer.is_neox_style:
            return "linear scaling on GPT-J pairs"
        factor = float(layer.scaling_factors[0])
        return _longrope_op(layer, base, factor, [factor] * (layer.rotary_dim // 2), 1.0)
    if isinstance(layer, YaRNScalingRotaryEmbedding):
        if not layer.is_neox_style:
            return "YaRN on GPT-J pairs"
        # vLLM's own YaRN frequencies as LongRoPE's per-frequency factors (the YaRN op's
        # correction dims are over half the rotary dim, vLLM's over all of it)
        factors = longrope_factors_for(layer._compute_inv_freq(layer.scaling_factor), base)
        return _longrope_op(layer, base, layer.scaling_factor, factors, layer.mscale)
    if isinstance(layer, DynamicNTKScalingRotaryEmbedding):
        # vLLM's "dynamic" NTK is static: one larger base, vLLM's formula
        ratio = layer.scaling_factor * max_position / layer.max_trained_positions - (layer.scaling_factor - 1)
        base *= ratio ** (layer.rotary_dim / (layer.rotary_dim - 2))
    if layer.is_neox_style:
        return ops.RopeNeoxPositionIdsFwdOp(max_position, base, **common)
    return ops.RopeNonNeoxPositionIdsFwdOp(max_position, base, **common)


_GAIN_BASE = 1 << 20  # the LongRoPE op's original_max_position_embeddings (_longrope_op)


def _longrope_op(layer: RotaryEmbedding, base: float, stretch: float, factors: list[float], gain: float):
    """``RopeLongRopePositionIdsFwdOp`` over vLLM's table of max_position_embeddings x
    ``stretch`` positions, with per-frequency ``factors`` and ``gain`` on cos and sin (vLLM's
    YaRN mscale; 1 for none), or a reason it cannot. The op's factor on cos and sin is
    sqrt(1 + ln(max / orig) / ln(orig)) of its two position counts, which set only that
    factor: orig = 2^20 and max = orig^(gain^2), rounded (a relative error under 1e-6 / gain^2)."""
    if gain == 1.0:
        top = _GAIN_BASE
    elif 1.0 < gain <= 1.75:  # orig^(gain^2) within int64
        top = round(_GAIN_BASE ** (gain * gain))
    else:
        return f"YaRN mscale {gain:.4g} (the op's cos/sin factor covers 1 to 1.75)"
    return ops.RopeLongRopePositionIdsFwdOp(
        math.ceil(layer.max_position_embeddings * stretch),  # vLLM's table: the stretched context
        base,
        rescale_factors=factors,
        max_position_embeddings=top,
        original_max_position_embeddings=_GAIN_BASE,
        rotary_dim=layer.rotary_dim,
    )


class _TileopsRope:
    """The tileops forward shared by the rotary classes: q and k [T, heads * head_size]
    rotated at ``positions`` [T] by the op ``_rope_op`` chose."""

    _vllm_name: str

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # vLLM's rotary class: its tables, its fallback
        op = _rope_op(self)
        if isinstance(op, str):
            self._op = None
            report.kept(self._vllm_name, op)
            return
        self._op = op
        report.served(self._vllm_name)
        report.served_custom_op("apply_rotary_emb")  # the original's helper; unused here

    def _tileops(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None):
        positions = positions.flatten()
        tokens = positions.shape[0]
        q = self._op(query.reshape(tokens, -1, self.head_size), positions).view(query.shape)
        if key is None:
            return q, None
        return q, self._op(key.reshape(tokens, -1, self.head_size), positions).view(key.shape)

    def forward_native(self, positions, query, key=None):
        if self._op is None:
            return super().forward_native(positions, query, key)
        return self._tileops(positions, query, key)

    def forward_cpu(self, positions, query, key=None):
        if self._op is None:
            return super().forward_cpu(positions, query, key)
        return self._tileops(positions, query, key)


class TileopsRotaryEmbedding(_TileopsRope, RotaryEmbedding):
    _vllm_name = "RotaryEmbedding"


class TileopsLlama3RotaryEmbedding(_TileopsRope, Llama3RotaryEmbedding):
    _vllm_name = "Llama3RotaryEmbedding"


class TileopsLinearScalingRotaryEmbedding(_TileopsRope, LinearScalingRotaryEmbedding):
    _vllm_name = "LinearScalingRotaryEmbedding"


class TileopsDynamicNTKScalingRotaryEmbedding(_TileopsRope, DynamicNTKScalingRotaryEmbedding):
    _vllm_name = "DynamicNTKScalingRotaryEmbedding"


class TileopsYaRNScalingRotaryEmbedding(_TileopsRope, YaRNScalingRotaryEmbedding):
    _vllm_name = "YaRNScalingRotaryEmbedding"


LAYERS = (
    TileopsRMSNorm,
    TileopsSiluAndMul,
    TileopsGeluAndMul,
    TileopsRotaryEmbedding,
    TileopsLlama3RotaryEmbedding,
    TileopsLinearScalingRotaryEmbedding,
    TileopsDynamicNTKScalingRotaryEmbedding,
    TileopsYaRNScalingRotaryEmbedding,
)


def _listed_as_kept(cls: type, why: str) -> None:
    """A vLLM layer that is not a custom op (no plugin can replace it): each instance is
    recorded as kept, so the log line lists it."""
    original = cls.__init__

    def __init__(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        report.kept(cls.__name__, why)

    cls.__init__ = __init__


def register() -> None:
    for cls in LAYERS:  # each under the vLLM class name it replaces
        CustomOp.register_oot(cls, name=cls._vllm_name)
    _listed_as_kept(Phi3LongRoPEScaledRotaryEmbedding, "not a vLLM custom op: no plugin hook")
