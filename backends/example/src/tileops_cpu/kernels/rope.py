"""Rotary position embeddings at explicit positions: RopeNeoxPositionIdsFwdOp,
RopeLlama31PositionIdsFwdOp and RopeLongRopePositionIdsFwdOp.

The three differ only in their frequencies (and LongRoPE in a factor on cos and sin), so
one kernel serves them: the builder computes the frequencies once, when it builds, and the
kernel turns each call's positions into angles. The recipe is the manifest's
(position_encoding.yaml): inv_freq and angle = position * inv_freq in float32, cos and sin
rounded to x's dtype, the rotation itself in float32 and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def plain_frequencies(half: int, base: float) -> torch.Tensor:
    """inv_freq[k] = 1 / base ** (k / half) for k < half, in float32."""
    return 1.0 / (base ** (torch.arange(half, dtype=torch.float32) / half))


def llama31_frequencies(
    half: int,
    base: float,
    *,
    scale_factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position: int,
) -> torch.Tensor:
    """Llama 3.1's: wavelengths 2*pi/f shorter than original_max_position / high_freq_factor
    keep f, longer than original_max_position / low_freq_factor take f / scale_factor, and
    the band between blends the two linearly."""
    f = plain_frequencies(half, base)
    wavelength = 2 * math.pi / f
    smooth = (original_max_position / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    blended = (1 - smooth) * f / scale_factor + smooth * f
    short = wavelength < original_max_position / high_freq_factor
    long = wavelength > original_max_position / low_freq_factor
    return torch.where(short, f, torch.where(long, f / scale_factor, blended))


def longrope_frequencies(half: int, base: float, rescale_factors: Sequence[float]) -> torch.Tensor:
    """LongRoPE's: each plain frequency divided by its own rescale factor."""
    return plain_frequencies(half, base) / torch.tensor(rescale_factors, dtype=torch.float32)


def longrope_factor(max_position_embeddings: int, original_max_position_embeddings: int) -> float:
    """LongRoPE's factor on cos and sin: sqrt(1 + ln r / ln original) for a context
    stretched r = max / original > 1 times, else 1."""
    ratio = max_position_embeddings / original_max_position_embeddings
    if ratio <= 1:
        return 1.0
    return math.sqrt(1 + math.log(ratio) / math.log(original_max_position_embeddings))


class CpuRopePositionIds:
    """x [T, H, D] and position_ids [T]: the first ``rotary_dim`` channels of every head
    rotate NeoX-style (channel c < rotary_dim / 2 pairs with c + rotary_dim / 2) by
    position * inv_freq; the other channels pass through (partial rotary, as Phi-3)."""

    def __init__(
        self, inv_freq: torch.Tensor, factor: float, rotary_dim: int, dtype: torch.dtype
    ) -> None:
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
        return (
            f"CpuRopePositionIds(rotary_dim={self.rotary_dim}, factor={self.factor}, "
            f"dtype={self.dtype})"
        )
