"""The cos/sin tables every RoPE op rotates by, and the inverse frequencies they come from:
the plain ones, and Llama 3.1's, YaRN's and LongRoPE's with the factor each puts on cos and
sin. This is what ``manifest/position_encoding.yaml`` states, written once: the references
(``tileops.testing.references``) judge with these tables, and a backend that builds its
tables ahead of the call (native_cpu) builds these, so the two cannot drift apart.

The recipe: inv_freq and angle = position * inv_freq in float32, cos and sin times the
scaling's factor, rounded to x's dtype. Only torch is imported, so a backend's builders can
use this without loading the op layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

__all__ = [
    "SCALINGS",
    "Scaling",
    "cos_sin",
    "frequencies",
    "llama31_inv_freq",
    "longrope_factor",
    "longrope_factors_for",
    "longrope_inv_freq",
    "plain_inv_freq",
    "yarn_inv_freq",
]


def plain_inv_freq(half: int, base: float, device: torch.device | None = None) -> torch.Tensor:
    """inv_freq[k] = 1 / base ** (k / half) for k < half, in float32."""
    return 1.0 / (base ** (torch.arange(half, dtype=torch.float32, device=device) / half))


def llama31_inv_freq(
    half: int,
    base: float,
    *,
    scale_factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Llama 3.1's: wavelengths 2*pi/f shorter than original_max_position / high_freq_factor
    keep f, longer than original_max_position / low_freq_factor take f / scale_factor, and
    the band between blends the two linearly."""
    f = plain_inv_freq(half, base, device)
    wavelength = 2 * math.pi / f
    smooth = (original_max_position / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    scaled = f / scale_factor
    blended = (1 - smooth) * scaled + smooth * f
    short = wavelength < original_max_position / high_freq_factor
    long = wavelength > original_max_position / low_freq_factor
    return torch.where(short, f, torch.where(long, scaled, blended))


def yarn_inv_freq(
    half: int,
    base: float,
    *,
    scale: float,
    original_max_position: int,
    beta_fast: float,
    beta_slow: float,
    device: torch.device | None = None,
) -> torch.Tensor:
    """YaRN's, as upstream computes them: interpolated ((scale * base)^(-k/half)) above the
    beta_slow correction dim, extrapolated (base^(-k/half)) below beta_fast, a linear ramp
    between; the correction dims are taken over ``half`` (upstream's convention)."""
    k = torch.arange(half, dtype=torch.float32, device=device)

    def correction_dim(rotations: float) -> float:
        return half * math.log(original_max_position / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), half - 1)
    high += low == high  # a ramp of one dim still needs a width
    keep = 1 - ((k - low) / (high - low)).clamp(0, 1)  # 1: extrapolated, 0: interpolated
    interpolated = plain_inv_freq(half, scale * base, device)
    return interpolated * (1 - keep) + plain_inv_freq(half, base, device) * keep


def longrope_inv_freq(
    half: int,
    base: float,
    *,
    rescale_factors: Sequence[float] | None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """LongRoPE's: each plain frequency divided by its own rescale factor (None: the plain ones)."""
    f = plain_inv_freq(half, base, device)
    if rescale_factors is None:
        return f
    return f / torch.tensor(rescale_factors, dtype=torch.float32, device=device)


def longrope_factors_for(inv_freq: torch.Tensor, base: float) -> list[float]:
    """The LongRoPE rescale factors (plain_inv_freq / inv_freq) under which
    longrope_inv_freq gives back ``inv_freq`` [half], any scaling's frequencies."""
    half = inv_freq.numel()
    return (plain_inv_freq(half, base).double() / inv_freq.double().cpu()).tolist()


def longrope_factor(max_position_embeddings: int, original_max_position_embeddings: int) -> float:
    """LongRoPE's factor on cos and sin: sqrt(1 + ln r / ln original) for a context stretched
    r = max / original > 1 times, else 1."""
    ratio = max_position_embeddings / original_max_position_embeddings
    if ratio <= 1:
        return 1.0
    return math.sqrt(1 + math.log(ratio) / math.log(original_max_position_embeddings))


class Scaling(NamedTuple):
    """A RoPE scaling: its frequencies, the op params they take, and its factor on cos and
    sin (from the op's params)."""

    inv_freq: Callable[..., torch.Tensor]
    names: tuple[str, ...]
    factor: Callable[[Mapping[str, Any]], float]


#: The scalings by the name the RoPE ops' builders and references use.
SCALINGS: dict[str, Scaling] = {
    "llama31": Scaling(
        llama31_inv_freq,
        ("scale_factor", "low_freq_factor", "high_freq_factor", "original_max_position"),
        lambda p: 1.0,
    ),
    "yarn": Scaling(
        yarn_inv_freq, ("scale", "original_max_position", "beta_fast", "beta_slow"), lambda p: float(p["attn_factor"])
    ),
    "longrope": Scaling(
        longrope_inv_freq,
        ("rescale_factors",),
        lambda p: longrope_factor(p["max_position_embeddings"], p["original_max_position_embeddings"]),
    ),
}


def frequencies(
    scaling: str | None,
    half: int,
    base: float,
    params: Mapping[str, Any] | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, float]:
    """(inv_freq [half], factor on cos and sin) of ``scaling`` (None: plain, factor 1), its
    params read from ``params`` (the op's; others there are ignored)."""
    if scaling is None:
        return plain_inv_freq(half, base, device), 1.0
    s, p = SCALINGS[scaling], params or {}
    return s.inv_freq(half, base, device=device, **{n: p[n] for n in s.names}), s.factor(p)


def cos_sin(
    positions: torch.Tensor,
    rotary_dim: int,
    base: float,
    dtype: torch.dtype,
    scaling: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [len(positions), rotary_dim // 2] on positions' device, of ``scaling``
    (None: the plain frequencies) with the op's ``params``, times the scaling's factor and
    rounded to ``dtype``."""
    inv_freq, factor = frequencies(scaling, rotary_dim // 2, base, params, positions.device)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)
