"""One builder factory per kernel family: ``factory(...)(op_name)`` is that op's
``build_kernel``. A builder checks its inputs against the op's manifest (refusing with what
was expected and what arrived), fixes the compile-time values and returns the kernel object
of its specialisation. The kinds (``"rms"``, ``"sum"``, ``"silu"``, ...) are member names of
the extension's enums (``_C.RowNorm``, ``_C.ReduceOp``, ``_C.Activation``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ._runtime import (
    ALL_DTYPES,
    FLOATS,
    check_broadcast,
    check_inputs,
    dtype_name,
    fail,
    native,
    native_dtype,
    native_lock,
    shape_of,
    specialisation,
)

Builder = Callable[..., Any]
Factory = Callable[[str], Builder]  # op name -> the op's build_kernel


# ---------------------------------------------------------------------------------------
# norm family (csrc/kernels/norm.h)


def _normalized(op: str, x: Any, normalized_shape: Sequence[int], **affine: Any) -> int:
    """The hidden size; x must end in normalized_shape, and each of ``affine`` be shaped so."""
    ns = tuple(int(s) for s in normalized_shape)
    if not ns:
        raise fail(op, "normalized_shape must not be empty", f"normalized_shape={ns}")
    if shape_of(x)[len(x.shape) - len(ns) :] != ns:
        raise fail(op, f"x must end in normalized_shape={ns}", f"x of shape {shape_of(x)}")
    for name, spec in affine.items():
        if shape_of(spec) != ns:
            raise fail(op, f"{name} must have shape normalized_shape={ns}", f"{name} of shape {shape_of(spec)}")
    return math.prod(ns)


def _row_norm(op: str, kind: str, x: Any, n: int, eps: float) -> Any:
    eps = float(eps)
    return specialisation(op, (x.dtype, n, eps), f"{dtype_name(x.dtype)}, hidden={n}, eps={eps}",
                          lambda C, threads, d: C.row_norm(C.RowNorm[kind], native_dtype(x.dtype), n, eps, threads, d))


def rms_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
            check_inputs(op, dtypes, x=x, weight=weight)
            return _row_norm(op, "rms", x, _normalized(op, x, normalized_shape, weight=weight), eps)

        return build

    return factory


def _fused_add(op: str, x: Any, residual: Any, **affine: Any) -> int:
    """The hidden size of a fused add + norm; refuses shapes its manifest refuses."""
    if len(x.shape) < 1:
        raise fail(op, "x must have at least 1 dim", f"x of shape {shape_of(x)}")
    if shape_of(residual) != shape_of(x):
        raise fail(op, f"residual must have x's shape {shape_of(x)}", f"residual of shape {shape_of(residual)}")
    n = int(x.shape[-1])
    for name, t in affine.items():
        if shape_of(t) != (n,):
            raise fail(op, f"{name} must have shape ({n},)", f"{name} of shape {shape_of(t)}")
    return n


def fused_add_rms_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, residual: Any, weight: Any, *, eps: float) -> Any:
            check_inputs(op, dtypes, x=x, residual=residual, weight=weight)
            return _row_norm(op, "fused_add_rms", x, _fused_add(op, x, residual, weight=weight), eps)

        return build

    return factory


def fused_add_layer_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, residual: Any, weight: Any, bias: Any, *, eps: float) -> Any:
            check_inputs(op, dtypes, x=x, residual=residual, weight=weight, bias=bias)
            return _row_norm(op, "fused_add_layer", x, _fused_add(op, x, residual, weight=weight, bias=bias), eps)

        return build

    return factory


def layer_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, bias: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
            check_inputs(op, dtypes, x=x, weight=weight, bias=bias)
            return _row_norm(op, "layer", x, _normalized(op, x, normalized_shape, weight=weight, bias=bias), eps)

        return build

    return factory


def group_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> Any:
            check_inputs(op, dtypes, x=x, weight=weight, bias=bias)
            if (weight is None) != (bias is None):
                raise fail(op, "weight and bias are given together or not at all",
                           f"weight={'None' if weight is None else 'given'}, bias={'None' if bias is None else 'given'}")
            if len(x.shape) < 2:
                raise fail(op, "x must be [N, C, *spatial]", f"x of shape {shape_of(x)}")
            c = int(x.shape[1])
            for name, spec in (("weight", weight), ("bias", bias)):
                if spec is not None and shape_of(spec) != (c,):
                    raise fail(op, f"{name} must have shape (C,) = ({c},)", f"{name} of shape {shape_of(spec)}")
            if num_groups <= 0 or c % num_groups != 0:
                raise fail(op, "channels must split evenly into num_groups", f"C={c}, num_groups={num_groups}")
            if x.shape[0] * (c // num_groups) * math.prod(x.shape[2:]) == 1:
                raise fail(op, "a group must not hold exactly one value (N * C / num_groups * prod(spatial) != 1)",
                           f"x of shape {shape_of(x)}, num_groups={num_groups}")
            affine, groups, eps_ = weight is not None, int(num_groups), float(eps)
            return specialisation(op, (x.dtype, groups, eps_, affine),
                                  f"{dtype_name(x.dtype)}, groups={groups}, affine={affine}, eps={eps_}",
                                  lambda C, threads, d: C.group_norm(native_dtype(x.dtype), groups, eps_, affine, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# softmax family (csrc/kernels/softmax.h)


def softmax(*, log: bool, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, *, dim: int | None) -> Any:
            check_inputs(op, dtypes, x=x)
            ndim = len(x.shape)
            axis = (0 if ndim in (0, 1, 3) else 1) if dim is None else dim
            rank = max(ndim, 1)
            if not -rank <= axis < rank:
                raise fail(op, f"dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {shape_of(x)}")
            axis %= rank
            return specialisation(op, (x.dtype, axis), f"{dtype_name(x.dtype)}, dim={axis}",
                                  lambda C, threads, d: C.softmax(native_dtype(x.dtype), axis, log, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# reduction family (csrc/kernels/reduction.h)


def reduction(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, *, dim: int | Sequence[int] | None, keepdim: bool) -> Any:
            check_inputs(op, dtypes, x=x)
            ndim, rank = len(x.shape), max(len(x.shape), 1)
            dims = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
            for d in dims:
                if not -rank <= d < rank:
                    raise fail(op, f"every dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {shape_of(x)}")
            if len({d % rank for d in dims}) != len(dims):
                raise fail(op, "dims must not repeat", f"dim={dim} for x of shape {shape_of(x)}")
            axes = set(range(ndim)) if not dims else {d % rank for d in dims} if ndim else set()
            if kind == "amax" and any(x.shape[a] == 0 for a in axes):
                raise fail(op, "amax over an empty axis has no value", f"x of shape {shape_of(x)}, dim={dim}")
            mask = [a in axes for a in range(ndim)]
            keep = bool(keepdim)
            return specialisation(op, (x.dtype, tuple(mask), keep), f"{dtype_name(x.dtype)}, dim={sorted(axes)}, keepdim={keep}",
                                  lambda C, threads, d: C.reduce(C.ReduceOp[kind], native_dtype(x.dtype), mask, keep, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# gemm family (csrc/kernels/gemm*.h)


def _gemm_kernel(op: str, dtype: torch.dtype, batched: bool, trans_a: bool, trans_b: bool) -> Any:
    describe = dtype_name(dtype) + ("" if batched else f", trans_a={trans_a}, trans_b={trans_b}")
    return specialisation(op, (dtype, trans_a, trans_b), describe,
                          lambda C, threads, d: C.gemm(native_dtype(dtype), batched, trans_a, trans_b, threads, d))


def gemm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(a: Any, b: Any, *, trans_a: bool, trans_b: bool) -> Any:
            dtype = check_inputs(op, dtypes, a=a, b=b)
            if len(a.shape) != 2 or len(b.shape) != 2:
                raise fail(op, "a and b must be 2-D", f"a of shape {shape_of(a)}, b of shape {shape_of(b)}")
            k_a = a.shape[0] if trans_a else a.shape[1]
            k_b = b.shape[1] if trans_b else b.shape[0]
            if k_a != k_b:
                raise fail(op, "a and b must share K", f"K={k_a} from a {shape_of(a)} (trans_a={trans_a}) "
                           f"and K={k_b} from b {shape_of(b)} (trans_b={trans_b})")
            return _gemm_kernel(op, dtype, False, bool(trans_a), bool(trans_b))

        return build

    return factory


def bmm(dtypes: Sequence[torch.dtype], *, k_multiple: int = 1) -> Factory:
    def factory(op: str) -> Builder:
        def build(a: Any, b: Any) -> Any:
            dtype = check_inputs(op, dtypes, a=a, b=b)
            if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
                raise fail(op, "a must be [B, M, K] and b [B, K, N]", f"a of shape {shape_of(a)}, b of shape {shape_of(b)}")
            if a.shape[2] % k_multiple:
                raise fail(op, f"K must be a multiple of {k_multiple}", f"K={a.shape[2]} from a of shape {shape_of(a)}")
            return _gemm_kernel(op, dtype, True, False, False)

        return build

    return factory


# ---------------------------------------------------------------------------------------
# elementwise family (csrc/kernels/elementwise.h)


def _representable(value: int | float, dtype: torch.dtype) -> bool:
    if dtype == torch.bool:
        return True
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min <= value <= info.max


def binary(kind: str, dtypes: Sequence[torch.dtype] = ALL_DTYPES) -> Factory:
    """``kind`` a member of _C.BinaryOp; ``add`` takes ``alpha`` (out = input + alpha * other)."""

    def make(op: str, x: Any, y: Any, alpha: int | float) -> Any:
        dtype = check_inputs(op, dtypes, input=x, other=y)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise fail(op, "alpha must be an int or a float", f"alpha={alpha!r}")
        if not dtype.is_floating_point and not isinstance(alpha, int):
            raise fail(op, f"alpha must be an int for {dtype_name(dtype)} tensors", f"alpha={alpha!r}")
        if not _representable(alpha, dtype):
            raise fail(op, f"alpha must be representable in {dtype_name(dtype)}", f"alpha={alpha!r}")
        check_broadcast(op, "input and other", x, y)
        a = float(alpha)
        return specialisation(op, (dtype, a), f"{dtype_name(dtype)}" + (f", alpha={alpha}" if kind == "add" else ""),
                              lambda C, threads, d: C.binary(C.BinaryOp[kind], native_dtype(dtype), a, threads, d))

    def factory(op: str) -> Builder:
        if kind == "add":

            def build_add(input: Any, other: Any, *, alpha: int | float = 1) -> Any:  # noqa: A002 (manifest name)
                return make(op, input, other, alpha)

            return build_add

        def build(input: Any, other: Any) -> Any:  # noqa: A002
            return make(op, input, other, 1)

        return build

    return factory


def _unary_kernel(op: str, activation: str, x: Any, inplace: bool) -> Any:
    return specialisation(op, (x.dtype, activation, inplace), f"{dtype_name(x.dtype)}, inplace={inplace}",
                          lambda C, threads, d: C.unary(C.Activation[activation], native_dtype(x.dtype), inplace, threads, d))


def activation(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """``kind`` a member of _C.Activation; the op takes ``inplace`` (writes ``input``)."""

    def factory(op: str) -> Builder:
        def build(input: Any, *, inplace: bool = False) -> Any:  # noqa: A002
            check_inputs(op, dtypes, input=input)
            return _unary_kernel(op, kind, input, bool(inplace))

        return build

    return factory


def activation_by_approximate(kinds: dict[str, str], dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """An op whose ``approximate`` param picks the _C.Activation (GeluFwdOp)."""

    def factory(op: str) -> Builder:
        def build(input: Any, *, approximate: str = "none") -> Any:  # noqa: A002
            check_inputs(op, dtypes, input=input)
            if approximate not in kinds:
                raise fail(op, f"approximate must be one of {sorted(kinds)}", f"approximate={approximate!r}")
            return _unary_kernel(op, kinds[approximate], input, False)

        return build

    return factory


def gated(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """act(x[:, :N]) * x[:, N:] for x [M, 2N], ``kind`` a member of _C.Activation that the
    gated kernel is compiled for (``GatedActivations`` in csrc/kernels/elementwise.h)."""

    def factory(op: str) -> Builder:
        def build(x: Any) -> Any:
            check_inputs(op, dtypes, x=x)
            if len(x.shape) != 2 or x.shape[1] % 2 != 0:
                raise fail(op, "x must be [M, 2N] ([gate | value], 2-D with an even last dim)", f"x of shape {shape_of(x)}")
            return specialisation(op, (x.dtype,), dtype_name(x.dtype),
                                  lambda C, threads, d: C.gated(C.Activation[kind], native_dtype(x.dtype), threads, d))

        return build

    return factory


def clamp(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(input: Any, min: Any, max: Any) -> Any:  # noqa: A002
            dtype = check_inputs(op, dtypes, input=input, min=min, max=max)
            if min is None and max is None:
                raise fail(op, "at least one of min and max must be given", "min=None, max=None")
            check_broadcast(op, "input, min and max", input, min, max)
            has_min, has_max = min is not None, max is not None
            describe = f"{dtype_name(dtype)}, min={'tensor' if has_min else None}, max={'tensor' if has_max else None}"
            return specialisation(op, (dtype, has_min, has_max), describe,
                                  lambda C, threads, d: C.clamp(native_dtype(dtype), has_min, has_max, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# rope family (csrc/kernels/rope.h)


def _inv_freq(half: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(half, dtype=torch.float32) / half))


def _llama31_inv_freq(half: int, base: float, scale_factor: float, low_freq_factor: float, high_freq_factor: float,
                      original_max_position: int) -> torch.Tensor:
    """Wavelengths 2*pi/f under orig/high_freq_factor keep f, over orig/low_freq_factor take
    f/scale_factor, a linear blend between."""
    f = _inv_freq(half, base)
    wl = 2 * math.pi / f
    s = (original_max_position / wl - low_freq_factor) / (high_freq_factor - low_freq_factor)
    scaled = f / scale_factor
    return torch.where(wl < original_max_position / high_freq_factor, f,
                       torch.where(wl > original_max_position / low_freq_factor, scaled, (1 - s) * scaled + s * f))


def _yarn_inv_freq(half: int, base: float, scale: float, original_max_position: int, beta_fast: float,
                   beta_slow: float) -> torch.Tensor:
    """Interpolated ((scale * base)^(-k/half)) below the beta_slow correction dim,
    extrapolated (base^(-k/half)) above beta_fast, a linear ramp between; correction dims
    over `half` (upstream's convention)."""
    k = torch.arange(half, dtype=torch.float32)

    def dim(rotations: float) -> float:
        return half * math.log(original_max_position / (2 * math.pi * rotations)) / (2 * math.log(base))

    low, high = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), half - 1)
    high += low == high
    keep = 1 - ((k - low) / (high - low)).clamp(0, 1)
    return _inv_freq(half, scale * base) * (1 - keep) + _inv_freq(half, base) * keep


def _longrope_inv_freq(half: int, base: float, rescale_factors: tuple[float, ...] | None) -> torch.Tensor:
    """Each plain frequency divided by its rescale factor (None: all ones)."""
    f = _inv_freq(half, base)
    return f if rescale_factors is None else f / torch.tensor(rescale_factors, dtype=torch.float32)


def _longrope_factor(max_position_embeddings: int, original_max_position_embeddings: int) -> float:
    """sqrt(1 + ln r / ln orig) on cos and sin for r = max / orig > 1, else 1."""
    r = max_position_embeddings / original_max_position_embeddings
    return math.sqrt(1 + math.log(r) / math.log(original_max_position_embeddings)) if r > 1 else 1.0


# A RoPE scaling: its params with their defaults, what must hold of them (as the op's
# param and shape rules; they also see `base` and `half`, the number of rotated pairs), and
# (half, base, **params) -> (inverse frequencies, factor on cos and sin).
class RopeScaling(NamedTuple):
    defaults: dict[str, Any]
    rules: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...]
    frequencies: Callable[..., tuple[torch.Tensor, float]]


ROPE_SCALINGS: dict[str, RopeScaling] = {
    "llama31": RopeScaling(
        dict(scale_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192),
        (("base > 0", lambda p: p["base"] > 0),
         ("scale_factor > 0", lambda p: p["scale_factor"] > 0),
         ("high_freq_factor > low_freq_factor > 0", lambda p: p["high_freq_factor"] > p["low_freq_factor"] > 0),
         ("original_max_position > 0", lambda p: p["original_max_position"] > 0)),
        lambda half, base, **p: (_llama31_inv_freq(half, base, **p), 1.0)),
    "yarn": RopeScaling(
        dict(scale=16.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0, attn_factor=1.0),
        (("base > 1", lambda p: p["base"] > 1),
         ("scale > 0", lambda p: p["scale"] > 0),
         ("original_max_position > 0", lambda p: p["original_max_position"] > 0),
         ("beta_fast > 0 and beta_slow > 0", lambda p: p["beta_fast"] > 0 and p["beta_slow"] > 0)),
        lambda half, base, attn_factor, **p: (_yarn_inv_freq(half, base, **p), float(attn_factor))),
    "longrope": RopeScaling(
        dict(rescale_factors=None, max_position_embeddings=4096, original_max_position_embeddings=4096),
        (("base > 0", lambda p: p["base"] > 0),
         ("rescale_factors is None or len(rescale_factors) == half (one factor per rotated pair)",
          lambda p: p["rescale_factors"] is None or len(p["rescale_factors"]) == p["half"]),
         ("rescale_factors is None or all(f > 0 for f in rescale_factors)",
          lambda p: p["rescale_factors"] is None or all(f > 0 for f in p["rescale_factors"])),
         ("max_position_embeddings > 0 and original_max_position_embeddings > 0",
          lambda p: p["max_position_embeddings"] > 0 and p["original_max_position_embeddings"] > 0),
         ("max_position_embeddings <= original_max_position_embeddings or original_max_position_embeddings > 1",
          lambda p: p["max_position_embeddings"] <= p["original_max_position_embeddings"]
          or p["original_max_position_embeddings"] > 1)),
        lambda half, base, rescale_factors, max_position_embeddings, original_max_position_embeddings: (
            _longrope_inv_freq(half, base, rescale_factors),
            _longrope_factor(max_position_embeddings, original_max_position_embeddings))),
}


def _rope_tables(positions: int, rotary_dim: int, base: float, dtype: torch.dtype,
                 inv_freq: torch.Tensor | None = None, factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin [positions, rotary_dim/2] (times `factor`), rounded through x's dtype
    like the op's tables."""
    freqs = _inv_freq(rotary_dim // 2, base) if inv_freq is None else inv_freq
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), freqs)
    return ((angles.cos() * factor).to(dtype).float().contiguous(), (angles.sin() * factor).to(dtype).float().contiguous())


def _scaling_params(op: str, scaled: RopeScaling | None, variant: dict[str, Any], base: float, half: int,
                    named: str) -> dict[str, Any]:
    """A scaling's params as given over its defaults (sequences as tuples of floats);
    refuses unknown ones and broken rules (`named`: the op's other params, for the message)."""
    known = dict(scaled.defaults) if scaled else {}
    unknown = sorted(set(variant) - set(known))
    if unknown:
        raise fail(op, f"params {named}{''.join(', ' + k for k in known)}", f"unknown {unknown}")
    known.update({k: tuple(float(f) for f in v) if isinstance(v, (list, tuple, torch.Tensor)) else v
                  for k, v in variant.items()})
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
                f", {k}={_shown(v)}" for k, v in extra)
            kernel = specialisation(
                op, (x.dtype, layout, head_dim, base_) + extra, describe,
                lambda C, threads, d: C.rope(C.RopeLayout[member], C.RopeRotation[rotation], native_dtype(x.dtype), head_dim,
                                             head_dim, threads, d))
            tables = scaled.frequencies(head_dim // 2, base_, **known) if scaled else ()
            # The tables are prefixes of one another (positions 0..S-1): keep the longest so far.
            with native_lock:
                have = native().rope_positions(kernel)
                if have < seq:
                    native().set_rope_tables(kernel, *_rope_tables(max(seq, 2 * have), head_dim, base_, x.dtype, *tables))
            return kernel

        return build

    return factory


def rope_position_ids(rotation: str = "neox", scaling: str | None = None,
                      dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """x [T, H, D] and position_ids [T] (int32 or int64); the first rotary_dim of D rotate
    (`rotation` as in `rope`), with a ROPE_SCALINGS entry's frequencies when `scaling`
    names one."""
    scaled = ROPE_SCALINGS[scaling] if scaling else None

    def factory(op: str) -> Builder:
        def build(x: Any, position_ids: Any, *, max_position: int, base: float = 10000.0, rotary_dim: int,
                  **variant: Any) -> Any:
            check_inputs(op, dtypes, x=x)
            check_inputs(op, (torch.int32, torch.int64), position_ids=position_ids)
            if len(x.shape) != 3:
                raise fail(op, "x must be [num_tokens, heads, head_dim]", f"x of shape {shape_of(x)}")
            if shape_of(position_ids) != (int(x.shape[0]),):
                raise fail(op, f"position_ids must have shape ({x.shape[0]},), one per token of x",
                           f"position_ids of shape {shape_of(position_ids)}")
            head_dim, rot, positions, base_ = int(x.shape[-1]), int(rotary_dim), int(max_position), float(base)
            if rot <= 0 or rot % 2 or rot > head_dim:
                raise fail(op, "rotary_dim must be positive, even and at most head_dim",
                           f"rotary_dim={rot}, head_dim={head_dim}")
            if positions <= 0:
                raise fail(op, "max_position must be positive", f"max_position={max_position}")
            known = _scaling_params(op, scaled, variant, base, rot // 2, "max_position, base, rotary_dim")
            extra = tuple(sorted(known.items()))

            def make(C: Any, threads: int, d: str) -> Any:
                kernel = C.rope(C.RopeLayout.thd_position_ids, C.RopeRotation[rotation], native_dtype(x.dtype), head_dim,
                                rot, threads, d)
                tables = scaled.frequencies(rot // 2, base_, **known) if scaled else ()
                C.set_rope_tables(kernel, *_rope_tables(positions, rot, base_, x.dtype, *tables))
                return kernel

            return specialisation(op, (x.dtype, head_dim, rot, positions, base_) + extra,
                                  f"{dtype_name(x.dtype)}, head_dim={head_dim}, rotary_dim={rot}, max_position={positions}"
                                  + "".join(f", {k}={_shown(v)}" for k, v in extra), make)

        return build

    return factory


# ---------------------------------------------------------------------------------------
# attention family (csrc/kernels/attention*.h)


def _attention_kernel(op: str, dtype: torch.dtype, form: str, q: Any, k: Any, *, slots: int, causal: bool = False,
                      window: tuple[int, int] = (-1, -1), sm_scale: float | None = None, softcap: float | None = None,
                      page_size: int = 0, padded: bool = False) -> Any:
    """The attention kernel of one form (csrc/bind/attention.cc's AttentionForm) for q's and
    k's head counts and head dim; row, request and cache counts are read per call."""
    heads, head_dim, heads_kv = int(q.shape[-2]), int(q.shape[-1]), int(k.shape[-2])
    if int(k.shape[-1]) != head_dim:
        raise fail(op, "q, k and v must share head_dim", f"q head_dim={head_dim}, k head_dim={k.shape[-1]}")
    if heads_kv == 0 or heads % heads_kv:
        raise fail(op, "heads must be a multiple of kv heads", f"H={heads}, H_kv={heads_kv}")
    if min(window) < -1:
        raise fail(op, "a window is -1 (off) or >= 0", f"window_size_left={window[0]}, window_size_right={window[1]}")
    group, scale, cap = heads // heads_kv, 0.0 if sm_scale is None else float(sm_scale), float(softcap or 0.0)
    if scale < 0 or cap < 0:
        raise fail(op, "sm_scale must be positive and softcap non-negative", f"sm_scale={sm_scale}, softcap={softcap}")
    describe = (f"{dtype_name(dtype)}, {form}, head_dim={head_dim}, group={group}, causal={causal}"
                + (f", window={window}" if window != (-1, -1) else "") + (f", sm_scale={scale}" if scale else "")
                + (f", softcap={cap}" if cap else "") + (f", page_size={page_size}" if page_size else ""))
    key = (dtype, form, head_dim, group, causal, window, scale, cap, page_size, padded, slots)
    return specialisation(op, key, describe, lambda C, threads, d: C.attention(
        native_dtype(dtype), getattr(C.AttentionForm, form), causal, head_dim, group, window[0], window[1], scale, cap,
        page_size, padded, slots, threads, d))


def _shapes(op: str, layout: str, rules: Sequence[bool], **specs: Any) -> None:
    """Refuses, naming the layout and the shapes that arrived, unless every rule holds
    (each is the manifest's shape rule of the same meaning)."""
    if not all(rules):
        got = ", ".join(f"{name} {shape_of(spec)}" for name, spec in specs.items() if spec is not None)
        raise fail(op, f"expected {layout}", got)


def _each(op: str, dtype: torch.dtype, **specs: Any) -> None:
    """Inputs of a fixed dtype of their own (offsets, tables, descales); None is absent."""
    for name, spec in specs.items():
        if spec is not None:
            check_inputs(op, (dtype,), **{name: spec})


def _indices(op: str, **specs: Any) -> None:
    _each(op, torch.int32, **specs)


def _packed(op: str, q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, layout: str) -> None:
    """q [Tq, H, D], k and v [Tk, Hkv, D] with H a multiple of Hkv, offsets [B+1] each."""
    q_, k_, cq, ck = shape_of(q), shape_of(k), shape_of(cu_q), shape_of(cu_k)
    _shapes(op, layout, [len(q_) == 3, len(k_) == 3], q=q, k=k)
    _shapes(op, layout, [shape_of(v) == k_, k_[2] == q_[2], len(cq) == 1 and cq[0] >= 2, ck == cq], q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def attention(dtypes: Sequence[torch.dtype], *, form: str) -> Factory:
    """Grouped-query attention in one layout (``form``), H a multiple of H_kv:
    ``prefill`` q [B, S, H, D], k and v [B, S, Hkv, D], causal and windows;
    ``decode`` q [B, H, D] against a dense cache k and v [B, N, Hkv, D], N > 0;
    ``varlen`` packed requests (q [Tq, H, D], k and v [Tk, Hkv, D], cu_seqlens [B+1]);
    ``varlen_window`` the same with trailing padding rows and no scale or softcap;
    ``paged_prefill`` a chunk per request appended to a paged cache, then attended;
    ``paged_decode`` one query per request against a paged cache."""

    def factory(op: str) -> Builder:
        if form == "prefill":

            def build_prefill(q: Any, k: Any, v: Any, *, is_causal: bool = True, window_size_left: int = -1,
                              window_size_right: int = -1) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                q_, k_ = shape_of(q), shape_of(k)
                layout = "q [B, S, H, D], k and v [B, S, H_kv, D]"
                _shapes(op, layout, [len(q_) == 4, len(k_) == 4], q=q, k=k)
                _shapes(op, layout, [shape_of(v) == k_, k_[0] == q_[0], k_[3] == q_[3]], q=q, k=k, v=v)
                if k_[1] != q_[1]:
                    raise fail(op, "k and v must have q's sequence length", f"q {q_}, k {k_}")
                return _attention_kernel(op, dtype, "prefill", q, k, slots=3, causal=bool(is_causal),
                                         window=(int(window_size_left), int(window_size_right)))

            return build_prefill
        if form == "decode":

            def build_decode(q: Any, k: Any, v: Any) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                q_, k_ = shape_of(q), shape_of(k)
                layout = "q [B, H, D], k and v [B, N_kv, H_kv, D] with N_kv > 0"
                _shapes(op, layout, [len(q_) == 3, len(k_) == 4], q=q, k=k)
                _shapes(op, layout, [shape_of(v) == k_, k_[0] == q_[0], k_[3] == q_[2]], q=q, k=k, v=v)
                if k_[1] == 0:
                    raise fail(op, "the cache must hold at least one position", f"k of shape {k_}")
                return _attention_kernel(op, dtype, "decode", q, k, slots=3, causal=True)

            return build_decode
        if form == "varlen":

            def build_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_kv: Any, q_scale: Any = None,
                             k_scale: Any = None, v_scale: Any = None, *, max_seqlen_q: int, max_seqlen_kv: int,
                             is_causal: bool = True, sm_scale: float | None = None, softcap: float | None = None,
                             window_size_left: int = -1, window_size_right: int = -1) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                _indices(op, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv)
                _each(op, torch.float32, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
                layout = "q [total_q, H, D], k and v [total_kv, H_kv, D], cu_seqlens [B+1], descales [B, H_kv]"
                _packed(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, layout)
                descale = (int(cu_seqlens_q.shape[0]) - 1, int(k.shape[1]))
                _shapes(op, layout, [s is None or shape_of(s) == descale for s in (q_scale, k_scale, v_scale)],
                        q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
                return _attention_kernel(op, dtype, "varlen", q, k, slots=8, causal=bool(is_causal),
                                         window=(int(window_size_left), int(window_size_right)), sm_scale=sm_scale,
                                         softcap=softcap)

            return build_varlen
        if form == "varlen_window":

            def build_varlen_window(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *,
                                    is_causal: bool = True, window_size_left: int = -1, window_size_right: int = -1,
                                    max_seqlen_q: int) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                _indices(op, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
                _packed(op, q, k, v, cu_seqlens_q, cu_seqlens_k, "q [total_q, H, D], k and v [total_k, H_kv, D], cu_seqlens [B+1]")
                return _attention_kernel(op, dtype, "varlen", q, k, slots=5, causal=bool(is_causal),
                                         window=(int(window_size_left), int(window_size_right)), padded=True)

            return build_varlen_window
        if form == "paged_prefill":

            def build_paged_prefill(q: Any, k_new: Any, v_new: Any, k_pages: Any, v_pages: Any, k_scale: Any,
                                    v_scale: Any, cu_seqlens_q: Any, cache_seqlens: Any, block_table: Any, *,
                                    max_pages_per_req: int, page_size: int, max_seqlen_q: int, is_causal: bool = True,
                                    sm_scale: float | None = None, softcap: float | None = None,
                                    window_size_left: int = -1) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k_new=k_new, v_new=v_new, k_pages=k_pages, v_pages=v_pages)
                _indices(op, cu_seqlens_q=cu_seqlens_q, cache_seqlens=cache_seqlens, block_table=block_table)
                _each(op, torch.float32, k_scale=k_scale, v_scale=v_scale)
                if int(page_size) <= 0:
                    raise fail(op, "page_size must be positive", f"page_size={page_size}")
                layout = ("q [total_q, H, D], k_new and v_new [total_q, H_kv, D], pages [N * page_size, H_kv, D], "
                          "cu_seqlens_q [B+1], cache_seqlens [B], block_table [B, max_pages_per_req], scales [1]")
                q_, kn, kp, cq = shape_of(q), shape_of(k_new), shape_of(k_pages), shape_of(cu_seqlens_q)
                specs = dict(q=q, k_new=k_new, v_new=v_new, k_pages=k_pages, v_pages=v_pages, cu_seqlens_q=cu_seqlens_q,
                             cache_seqlens=cache_seqlens, block_table=block_table, k_scale=k_scale, v_scale=v_scale)
                _shapes(op, layout, [len(q_) == 3, len(kn) == 3, len(kp) == 3, len(cq) == 1], **specs)
                _shapes(op, layout, [kn[0] == q_[0], kn[2] == q_[2], shape_of(v_new) == kn, kp[1:] == kn[1:],
                                     shape_of(v_pages) == kp,
                                     kp[0] % int(page_size) == 0, cq[0] >= 2,
                                     shape_of(cache_seqlens) == (cq[0] - 1,),
                                     shape_of(block_table) == (cq[0] - 1, int(max_pages_per_req)),
                                     all(s is None or shape_of(s) == (1,) for s in (k_scale, v_scale))], **specs)
                return _attention_kernel(op, dtype, "paged_prefill", q, k_pages, slots=10, causal=bool(is_causal),
                                         sm_scale=sm_scale, softcap=softcap, page_size=int(page_size),
                                         window=(int(window_size_left), -1))

            return build_paged_prefill
        if form == "paged_decode":

            def build_paged_decode(q: Any, k: Any, v: Any, real_seqlen_kv: Any, block_table: Any, *, page_size: int,
                                   sm_scale: float | None = None, softcap: float | None = None,
                                   window_size_left: int = -1) -> Any:
                dtype = check_inputs(op, dtypes, q=q, k=k, v=v)
                _indices(op, real_seqlen_kv=real_seqlen_kv, block_table=block_table)
                if int(page_size) <= 0:
                    raise fail(op, "page_size must be positive", f"page_size={page_size}")
                layout = "q [B, H, D], k and v [N * page_size, H_kv, D], real_seqlen_kv [B], block_table [B, P]"
                q_, k_, bt = shape_of(q), shape_of(k), shape_of(block_table)
                specs = dict(q=q, k=k, v=v, real_seqlen_kv=real_seqlen_kv, block_table=block_table)
                _shapes(op, layout, [len(q_) == 3, len(k_) == 3], **specs)
                _shapes(op, layout, [shape_of(v) == k_, k_[2] == q_[2], k_[0] % int(page_size) == 0, shape_of(real_seqlen_kv) == (q_[0],),
                                     len(bt) == 2 and bt[0] == q_[0]], **specs)
                return _attention_kernel(op, dtype, "paged_decode", q, k, slots=5, causal=True, sm_scale=sm_scale,
                                         softcap=softcap, page_size=int(page_size), window=(int(window_size_left), -1))

            return build_paged_decode
        raise ValueError(f"unknown attention form {form!r}")

    return factory



# ---------------------------------------------------------------------------------------
# moe family (csrc/kernels/moe*.h)

_MOE_SCORINGS = ("softmax", "sigmoid")
_MOE_ACTIVATIONS = ("silu_and_mul", "gelu_and_mul")


def _moe_routing(op: str, experts: int, top_k: Any, scoring_func: str, bias: Any) -> int:
    """Checks what both MoE ops' routing needs; returns top_k as an int."""
    if top_k is None or isinstance(top_k, bool) or int(top_k) < 1:
        raise fail(op, "top_k must be an int >= 1", f"top_k={top_k!r}")
    if int(top_k) > experts:
        raise fail(op, f"top_k must be at most the number of experts ({experts})", f"top_k={top_k}")
    if scoring_func not in _MOE_SCORINGS:
        raise fail(op, f"scoring_func must be one of {list(_MOE_SCORINGS)}", f"scoring_func={scoring_func!r}")
    if bias is not None:
        check_inputs(op, (torch.float32,), correction_bias=bias)
        if scoring_func != "sigmoid":
            raise fail(op, "a correction_bias needs scoring_func='sigmoid'", f"scoring_func={scoring_func!r}")
        if shape_of(bias) != (experts,):
            raise fail(op, f"correction_bias must be [{experts}] (one per expert)", f"correction_bias of shape {shape_of(bias)}")
    return int(top_k)


def fused_topk(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """gating_output [T, E] -> (topk_weights float32 [T, K], topk_ids int32 [T, K]); T is
    read at call time."""

    def factory(op: str) -> Builder:
        def build(gating_output: Any, correction_bias: Any, *, num_tokens: int | None = None,
                  num_experts: int | None = None, top_k: int | None = None, scoring_func: str = "softmax",
                  renormalize: bool = False) -> Any:
            check_inputs(op, dtypes, gating_output=gating_output)
            if len(gating_output.shape) != 2:
                raise fail(op, "gating_output must be [tokens, experts]", f"gating_output of shape {shape_of(gating_output)}")
            tokens, experts = shape_of(gating_output)
            if num_experts is not None and num_experts != experts:
                raise fail(op, f"gating_output must have num_experts={num_experts} columns", f"gating_output of shape {(tokens, experts)}")
            if num_tokens is not None and tokens > num_tokens:
                raise fail(op, f"gating_output may have at most num_tokens={num_tokens} rows", f"gating_output of shape {(tokens, experts)}")
            k = _moe_routing(op, experts, top_k, scoring_func, correction_bias)
            dtype, renorm, has_bias = gating_output.dtype, bool(renormalize), correction_bias is not None
            return specialisation(op, (dtype, k, scoring_func, renorm, has_bias),
                                  f"{dtype_name(dtype)}, top_k={k}, scoring_func={scoring_func}, renormalize={renorm}, bias={has_bias}",
                                  lambda C, threads, d: C.fused_topk(native_dtype(dtype), k, C.MoeScoring[scoring_func], renorm,
                                                                     has_bias, threads, d))

        return build

    return factory


def fused_moe(dtypes: Sequence[torch.dtype]) -> Factory:
    """hidden_states [T, H], gating_output [T, E] float32, w_gate_up [E, 2F, H], w_down
    [E, H, F], correction_bias [E] float32 or None -> output [T, H]; T (at most num_tokens)
    is read at call time, the rest is fixed."""

    def factory(op: str) -> Builder:
        def build(hidden_states: Any, gating_output: Any, w_gate_up: Any, w_down: Any, correction_bias: Any, *,
                  num_tokens: int, num_experts: int, top_k: int, hidden_size: int, ffn_size: int,
                  scoring_func: str = "softmax", renormalize: bool = False, routed_scaling_factor: float = 1.0,
                  activation: str = "silu_and_mul") -> Any:
            dtype = check_inputs(op, dtypes, hidden_states=hidden_states, w_gate_up=w_gate_up, w_down=w_down)
            check_inputs(op, (torch.float32,), gating_output=gating_output)
            e, h, f = int(num_experts), int(hidden_size), int(ffn_size)
            if e < 1 or h < 1 or f < 1:
                raise fail(op, "num_experts, hidden_size and ffn_size must be >= 1", f"{e}, {h}, {f}")
            tokens = int(hidden_states.shape[0]) if len(hidden_states.shape) == 2 else -1
            expected = {"hidden_states": (tokens, h), "gating_output": (tokens, e),
                        "w_gate_up": (e, 2 * f, h), "w_down": (e, h, f)}
            given = {"hidden_states": hidden_states, "gating_output": gating_output, "w_gate_up": w_gate_up, "w_down": w_down}
            for name, want in expected.items():
                if tokens < 0 or shape_of(given[name]) != want:
                    raise fail(op, f"{name} must be [{', '.join(map(str, want)) if tokens >= 0 else 'tokens, hidden_size'}] "
                               f"(num_experts={e}, hidden_size={h}, ffn_size={f})", f"{name} of shape {shape_of(given[name])}")
            if tokens > num_tokens:
                raise fail(op, f"hidden_states may have at most num_tokens={num_tokens} rows", f"{tokens} rows")
            if activation not in _MOE_ACTIVATIONS:
                raise fail(op, f"activation must be one of {list(_MOE_ACTIVATIONS)}", f"activation={activation!r}")
            k = _moe_routing(op, e, top_k, scoring_func, correction_bias)
            renorm, scale, has_bias = bool(renormalize), float(routed_scaling_factor), correction_bias is not None
            return specialisation(
                op, (dtype, e, k, h, f, scoring_func, renorm, scale, activation, has_bias),
                f"{dtype_name(dtype)}, experts={e}, top_k={k}, hidden={h}, ffn={f}, scoring_func={scoring_func}, "
                f"renormalize={renorm}, scale={scale}, {activation}, bias={has_bias}",
                lambda C, threads, d: C.fused_moe(native_dtype(dtype), e, k, h, f, C.MoeScoring[scoring_func], renorm, scale,
                                                  C.MoeActivation[activation], has_bias, threads, d))

        return build

    return factory
