"""Rotary position embeddings at explicit positions: RopeNeoxPositionIdsFwdOp,
RopeLlama31PositionIdsFwdOp and RopeLongRopePositionIdsFwdOp.

The three differ only in their frequencies (and LongRoPE in a factor on cos and sin), so
one kernel serves them: the builder computes the frequencies once, when it builds (with
``tileops.rope_tables``, the formulas every target's RoPE is checked against), and the
kernel turns each call's positions into angles. The recipe is the manifest's
(position_encoding.yaml): inv_freq and angle = position * inv_freq in float32, cos and sin
rounded to x's dtype, the rotation itself in float32 and rounded once.
"""

from __future__ import annotations

import torch


class CpuRopePositionIds:
    """x [T, H, D] and position_ids [T]: the first ``rotary_dim`` channels of every head
    rotate NeoX-style (channel c < rotary_dim / 2 pairs with c + rotary_dim / 2) by
    position * inv_freq; the other channels pass through (partial rotary, as Phi-3)."""

    def __init__(self, inv_freq: torch.Tensor, factor: float, rotary_dim: int, dtype: torch.dtype) -> None:
        if inv_freq.shape != (rotary_dim // 2,):
            raise ValueError(
                f"CpuRopePositionIds needs one frequency per rotated pair, "
                f"[{rotary_dim // 2}] for rotary_dim={rotary_dim}; got {tuple(inv_freq.shape)}"
            )
        self.inv_freq = inv_freq.to(torch.float32)
        self.factor = float(factor)
        self.rotary_dim = int(rotary_dim)
        self.dtype = dtype

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        half, rot = self.rotary_dim // 2, self.rotary_dim
        angles = position_ids.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, half]
        # the op's tables are rounded to x's dtype: round them the same way
        cos = (angles.cos() * self.factor).to(self.dtype).float()[:, None, :]  # [T, 1, half]
        sin = (angles.sin() * self.factor).to(self.dtype).float()[:, None, :]
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:rot]
        rotated = (x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., rot:])
        return torch.cat(rotated, dim=-1).to(self.dtype)

    def __repr__(self) -> str:
        return f"CpuRopePositionIds(rotary_dim={self.rotary_dim}, factor={self.factor}, dtype={self.dtype})"
