"""The position-id RoPE op an attention layer gets, chosen from transformers' own rotary
embedding: its type, its frequencies (which also say how many channels of a head rotate)
and the factor on cos and sin that goes into the attention scale."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ....rope_tables import longrope_factors_for, plain_inv_freq
from .plan import Plan

__all__ = ["LongRope", "rope_op", "rope_params"]


def rope_params(config: Any, module: nn.Module) -> dict:
    params = config.rope_parameters or {}
    layer_type = getattr(module, "layer_type", None)
    if "rope_type" not in params and layer_type in params:  # per layer type (Gemma 3)
        params = params[layer_type]
    return params


class LongRope:
    """LongRoPE as transformers applies it: the short factors while a call's positions stay
    within original_max_position_embeddings, the long ones for a call that reaches past it
    (transformers picks per forward call from max(position_ids) + 1, and keeps the keys it
    cached under the other set as they are; so does the cache here)."""

    def __init__(self, short: Any, long: Any, original: int) -> None:
        self.short, self.long, self.original = short, long, original

    def held_ops(self) -> list[Any]:
        return [self.short, self.long]

    def __call__(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        op = self.long if pos.numel() and int(pos.max()) + 1 > self.original else self.short
        return op(x, pos)


def rope_op(config: Any, module: nn.Module, name: str, plan: Plan):
    """(the position-id RoPE op for this attention module, the factor on cos and sin it leaves
    to the attention scale), or (None, 1.0): refused."""
    ops = plan.ops
    params = rope_params(config, module)
    rope_type = params.get("rope_type", "default")
    base = float(params.get("rope_theta", 10000.0))
    served = ("default", "dynamic", "linear", "longrope", "llama3", "yarn")
    if rope_type not in served:
        plan.refuse(
            name,
            "rotary embedding",
            f"rope_parameters rope_type={rope_type!r} "
            f"(served: default, linear, dynamic below max_position_embeddings, longrope, llama3, yarn)",
        )
        return None, 1.0
    # transformers' own frequencies say how many channels of a head rotate: a model whose
    # default RoPE honours partial_rotary_factor (Phi-3) builds a table for fewer than
    # head_dim channels, one that ignores it (Llama) a whole one
    inv_freq, gain = _transformers_rope(config, module, rope_type, plan.model)
    dim = 2 * inv_freq.numel()
    if dim != module.head_dim and not _rotates_part_of_a_head(module):
        plan.refuse(
            name,
            "partial rotary embedding",
            f"rope_parameters partial_rotary_factor={params.get('partial_rotary_factor')} with "
            f"rope_type={rope_type!r}: transformers' {type(module).__name__} rotates the whole head and fails "
            "on the partial table",
        )
        return None, 1.0
    common = dict(rotary_dim=dim, target=plan.target)
    max_position = int(config.max_position_embeddings)
    # the ops' own attention factors stay 1 (max_position_embeddings == original): transformers'
    # factor on cos and sin multiplies q and k alike, so it goes into the attention scale squared
    scaled = dict(max_position_embeddings=max_position, original_max_position_embeddings=max_position, **common)
    if rope_type in ("default", "dynamic"):
        # dynamic NTK keeps the default frequencies while positions stay below
        # max_position_embeddings; past it the call raises (the scaled frequencies are not served)
        return ops.RopeNeoxPositionIdsFwdOp(max_position, base, **common), 1.0
    if rope_type == "linear":  # every frequency divided by factor: LongRoPE's per-frequency factors, all equal
        return ops.RopeLongRopePositionIdsFwdOp(
            max_position, base, rescale_factors=[float(params["factor"])] * (dim // 2), **scaled
        ), 1.0
    if rope_type == "longrope":
        short, long = (
            ops.RopeLongRopePositionIdsFwdOp(
                max_position, base, rescale_factors=[float(f) for f in params[k]], **scaled
            )
            for k in ("short_factor", "long_factor")
        )
        return LongRope(short, long, int(params["original_max_position_embeddings"])), gain
    if rope_type == "llama3":
        return ops.RopeLlama31PositionIdsFwdOp(
            max_position,
            base,
            scale_factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]),
            **common,
        ), 1.0
    # yarn: transformers' YaRN (correction dims over the whole rotary dim, interpolation f /
    # factor) is not the YaRN op's convention (over half of it, (factor * base)^(-k/half)):
    # its own frequencies, as LongRoPE per-frequency factors
    return ops.RopeLongRopePositionIdsFwdOp(
        max_position, base, rescale_factors=longrope_factors_for(inv_freq, base), **scaled
    ), gain


def _transformers_rope(config: Any, module: nn.Module, rope_type: str, model: nn.Module) -> tuple[torch.Tensor, float]:
    """transformers' own (inverse frequencies, factor on cos and sin) for this layer: the
    model's rotary embedding's default, or the scaled type's init function."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: PLC0415

    layer_type = getattr(module, "layer_type", None)
    per_layer = "rope_type" not in (config.rope_parameters or {}) and layer_type is not None
    kw = {"layer_type": layer_type} if per_layer else {}
    if rope_type == "default":
        rotary = next((type(m) for m in model.modules() if hasattr(type(m), "compute_default_rope_parameters")), None)
        if rotary is None:  # no rotary embedding of its own: the whole head, at the plain frequencies
            return plain_inv_freq(module.head_dim // 2, config.rope_parameters.get("rope_theta", 10000.0)), 1.0
        inv_freq, gain = rotary.compute_default_rope_parameters(config, device=None, **kw)
    else:
        inv_freq, gain = ROPE_INIT_FUNCTIONS[rope_type](config, None, **kw)
    return inv_freq.float(), float(gain)


def _rotates_part_of_a_head(attention: nn.Module) -> bool:
    """Whether the attention's modeling module applies a rotary table narrower than a head
    (rotating its leading channels, as Phi-3's apply_rotary_pos_emb does) rather than
    failing on it (Llama's): tried on a head of 4 channels with a table of 2."""
    apply = getattr(sys.modules.get(type(attention).__module__), "apply_rotary_pos_emb", None)
    if apply is None:
        return False
    head, table = torch.zeros(1, 1, 1, 4), torch.ones(1, 1, 2)
    try:
        apply(head, head, table, table)
    except RuntimeError:
        return False
    return True
