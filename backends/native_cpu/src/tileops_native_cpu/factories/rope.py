"""The rope family's factories (csrc/kernels/rope.h): RoPE at positions 0..S-1 and at explicit
positions, plain or scaled. The kernels rotate by cos/sin tables the builders hand them,
built by tileops.rope_tables (what the references judge by)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from tileops.rope_tables import cos_sin

from .._runtime import (
    FLOATS,
    check_inputs,
    dtype_name,
    fail,
    native,
    native_dtype,
    native_lock,
    shape_of,
    specialisation,
)
from .common import Builder, Factory


# A RoPE scaling's params with their defaults, and what must hold of them (as the op's param
# and shape rules; they also see `base` and `half`, the number of rotated pairs). Its
# frequencies and factor on cos and sin are tileops.rope_tables.SCALINGS' entry of the same name.
class RopeScaling(NamedTuple):
    defaults: dict[str, Any]
    rules: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...]


ROPE_SCALINGS: dict[str, RopeScaling] = {
    "llama31": RopeScaling(
        dict(scale_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192),
        (
            ("base > 0", lambda p: p["base"] > 0),
            ("scale_factor > 0", lambda p: p["scale_factor"] > 0),
            ("high_freq_factor > low_freq_factor > 0", lambda p: p["high_freq_factor"] > p["low_freq_factor"] > 0),
            ("original_max_position > 0", lambda p: p["original_max_position"] > 0),
        ),
    ),
    "yarn": RopeScaling(
        dict(scale=16.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0, attn_factor=1.0),
        (
            ("base > 1", lambda p: p["base"] > 1),
            ("scale > 0", lambda p: p["scale"] > 0),
            ("original_max_position > 0", lambda p: p["original_max_position"] > 0),
            ("beta_fast > 0 and beta_slow > 0", lambda p: p["beta_fast"] > 0 and p["beta_slow"] > 0),
        ),
    ),
    "longrope": RopeScaling(
        dict(rescale_factors=None, max_position_embeddings=4096, original_max_position_embeddings=4096),
        (
            ("base > 0", lambda p: p["base"] > 0),
            (
                "rescale_factors is None or len(rescale_factors) == half (one factor per rotated pair)",
                lambda p: p["rescale_factors"] is None or len(p["rescale_factors"]) == p["half"],
            ),
            (
                "rescale_factors is None or all(f > 0 for f in rescale_factors)",
                lambda p: p["rescale_factors"] is None or all(f > 0 for f in p["rescale_factors"]),
            ),
            (
                "max_position_embeddings > 0 and original_max_position_embeddings > 0",
                lambda p: p["max_position_embeddings"] > 0 and p["original_max_position_embeddings"] > 0,
            ),
            (
                "max_position_embeddings <= original_max_position_embeddings or original_max_position_embeddings > 1",
                lambda p: (
                    p["max_position_embeddings"] <= p["original_max_position_embeddings"]
                    or p["original_max_position_embeddings"] > 1
                ),
            ),
        ),
    ),
}


def _rope_tables(
    positions: int, rotary_dim: int, base: float, dtype: torch.dtype, scaling: str | None, params: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's cos/sin [positions, rotary_dim/2] (rounded to x's dtype), widened to the
    float32 the kernels read."""
    cos, sin = cos_sin(torch.arange(positions), rotary_dim, base, dtype, scaling, params)
    return cos.float().contiguous(), sin.float().contiguous()


def _scaling_params(
    op: str, scaled: RopeScaling | None, variant: dict[str, Any], base: float, half: int, named: str
) -> dict[str, Any]:
    """A scaling's params as given over its defaults (sequences as tuples of floats);
    refuses unknown ones and broken rules (`named`: the op's other params, for the message)."""
    known = dict(scaled.defaults) if scaled else {}
    unknown = sorted(set(variant) - set(known))
    if unknown:
        raise fail(op, f"params {named}{''.join(', ' + k for k in known)}", f"unknown {unknown}")
    known.update(
        {k: tuple(float(f) for f in v) if isinstance(v, (list, tuple, torch.Tensor)) else v for k, v in variant.items()}
    )
    judged = dict(known, base=base, half=half)  # the rules read base and half too
    for rule, holds in scaled.rules if scaled else ():
        if not holds(judged):
            raise fail(op, rule, ", ".join(f"{k}={_shown(v)}" for k, v in judged.items()))
    return known


def _shown(value: Any) -> str:
    """A param for a message or a description: sequences by their length and ends."""
    if isinstance(value, tuple) and len(value) > 4:
        return f"({value[0]!r}, {value[1]!r}, ..., {value[-1]!r}: {len(value)} values)"
    return repr(value)


def rope(rotation: str = "neox", scaling: str | None = None, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """x [S, D] (layout '1d') or [B, S, H, D] ('2d'), positions 0..S-1; `rotation` is a
    `_C.RopeRotation` member ("neox": half split, "pairs": adjacent pairs); `scaling` names
    a ROPE_SCALINGS entry whose params the builder then takes too."""
    layouts = {"1d": ("sd", 2), "2d": ("bshd", 4)}
    scaled = ROPE_SCALINGS[scaling] if scaling else None

    def factory(op: str) -> Builder:
        def build(x: Any, *, layout: str = "1d", base: float = 10000.0, **variant: Any) -> Any:
            check_inputs(op, dtypes, x=x)
            if layout not in layouts:
                raise fail(op, "layout must be '1d' ([S, D]) or '2d' ([B, S, H, D])", f"layout={layout!r}")
            member, ndim = layouts[layout]
            if len(x.shape) != ndim:
                raise fail(op, f"layout {layout!r} needs a {ndim}-D x", f"x of shape {shape_of(x)}")
            head_dim = int(x.shape[-1])
            if head_dim <= 0 or head_dim % 2:
                raise fail(op, "head_dim must be positive and even", f"head_dim={head_dim}")
            known = _scaling_params(op, scaled, variant, base, head_dim // 2, "layout, base")
            seq, base_ = int(x.shape[0] if layout == "1d" else x.shape[1]), float(base)
            extra = tuple(sorted(known.items()))
            describe = f"{dtype_name(x.dtype)}, layout={layout}, head_dim={head_dim}, base={base}" + "".join(
                f", {k}={_shown(v)}" for k, v in extra
            )
            kernel = specialisation(
                op,
                (x.dtype, layout, head_dim, base_) + extra,
                describe,
                lambda C, threads, d: C.rope(
                    C.RopeLayout[member],
                    C.RopeRotation[rotation],
                    native_dtype(x.dtype),
                    head_dim,
                    head_dim,
                    threads,
                    d,
                ),
            )
            # The tables are prefixes of one another (positions 0..S-1): keep the longest so far.
            with native_lock:
                have = native().rope_positions(kernel)
                if have < seq:
                    tables = _rope_tables(max(seq, 2 * have), head_dim, base_, x.dtype, scaling, known)
                    native().set_rope_tables(kernel, *tables)
            return kernel

        return build

    return factory


def rope_position_ids(
    rotation: str = "neox", scaling: str | None = None, dtypes: Sequence[torch.dtype] = FLOATS
) -> Factory:
    """x [T, H, D] and position_ids [T] (int32 or int64); the first rotary_dim of D rotate
    (`rotation` as in `rope`), with a ROPE_SCALINGS entry's frequencies when `scaling`
    names one."""
    scaled = ROPE_SCALINGS[scaling] if scaling else None

    def factory(op: str) -> Builder:
        def build(
            x: Any, position_ids: Any, *, max_position: int, base: float = 10000.0, rotary_dim: int, **variant: Any
        ) -> Any:
            check_inputs(op, dtypes, x=x)
            check_inputs(op, (torch.int32, torch.int64), position_ids=position_ids)
            if len(x.shape) != 3:
                raise fail(op, "x must be [num_tokens, heads, head_dim]", f"x of shape {shape_of(x)}")
            if shape_of(position_ids) != (int(x.shape[0]),):
                raise fail(
                    op,
                    f"position_ids must have shape ({x.shape[0]},), one per token of x",
                    f"position_ids of shape {shape_of(position_ids)}",
                )
            head_dim, rot, positions, base_ = int(x.shape[-1]), int(rotary_dim), int(max_position), float(base)
            if rot <= 0 or rot % 2 or rot > head_dim:
                raise fail(
                    op,
                    "rotary_dim must be positive, even and at most head_dim",
                    f"rotary_dim={rot}, head_dim={head_dim}",
                )
            if positions <= 0:
                raise fail(op, "max_position must be positive", f"max_position={max_position}")
            known = _scaling_params(op, scaled, variant, base, rot // 2, "max_position, base, rotary_dim")
            extra = tuple(sorted(known.items()))

            def make(C: Any, threads: int, d: str) -> Any:
                kernel = C.rope(
                    C.RopeLayout.thd_position_ids,
                    C.RopeRotation[rotation],
                    native_dtype(x.dtype),
                    head_dim,
                    rot,
                    threads,
                    d,
                )
                C.set_rope_tables(kernel, *_rope_tables(positions, rot, base_, x.dtype, scaling, known))
                return kernel

            return specialisation(
                op,
                (x.dtype, head_dim, rot, positions, base_) + extra,
                f"{dtype_name(x.dtype)}, head_dim={head_dim}, rotary_dim={rot}, "
                f"max_position={positions}" + "".join(f", {k}={_shown(v)}" for k, v in extra),
                make,
            )

        return build

    return factory
