"""GGML block formats, the way GGUF files store weights, in PyTorch.

A GGUF weight of shape ``[..., k]`` is stored row by row; a row is ``k / block_size``
blocks laid end to end, each ``type_size`` bytes (``row_bytes``). This module is the one
place tileops reads and writes those bytes: the op layer's references, the conformance
harness, the example backend and the GGUF loader all use it.

Layouts (little-endian; ``half`` is IEEE float16; facts from llama.cpp's
``ggml/src/ggml-common.h`` and ``ggml-quants.c``):

========  =====  =====  ==========================================================
type      block  bytes  block
========  =====  =====  ==========================================================
F32       1      4      one float32
F16       1      2      one float16
BF16      1      2      one bfloat16 (the high half of a float32)
Q8_0      32     34     ``half d; int8 qs[32]``
Q4_0      32     18     ``half d; uint8 qs[16]``
Q4_1      32     20     ``half d, m; uint8 qs[16]``
Q4_K      256    144    ``half d, dmin; uint8 scales[12]; uint8 qs[128]``
Q5_K      256    176    ``half d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]``
Q6_K      256    210    ``uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d``
========  =====  =====  ==========================================================

``dequantize`` is exact: the float16 fields convert to float32 exactly and every product
it forms (a float16 times a small integer, times another small integer) fits float32's
24-bit significand, so the only rounding is the final add or subtract of Q4_1, Q4_K and
Q5_K, done once, as llama.cpp's ``dequantize_row_*`` do. The results are bit-identical
to llama.cpp's and to gguf-py's, fused multiply-add or not.

``quantize`` follows llama.cpp's reference quantizers (``quantize_row_q8_0_ref``,
``quantize_row_q4_0_ref``, ``quantize_row_q4_1_ref``: what ``llama-quantize`` writes for
these types without an importance matrix), each step in float32 with its own rounding.
The K-quants have no simple reference quantizer (llama.cpp searches for scales); tests
get valid K-quant blocks from ``random_blocks``.

>>> import torch
>>> from tileops.quant.ggml_blocks import dequantize, quantize, row_bytes
>>> w = torch.linspace(-1, 1, 64).reshape(2, 32)
>>> blocks = quantize(w, "Q8_0")
>>> blocks.shape, blocks.dtype, row_bytes("Q8_0", 32)
(torch.Size([2, 34]), torch.uint8, 34)
>>> (dequantize(blocks, "Q8_0") - w).abs().max().item() < 1 / 254
True
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = [
    "GGML_TYPES",
    "GgmlType",
    "dequantize",
    "ggml_type",
    "quantize",
    "random_blocks",
    "row_bytes",
]


@dataclass(frozen=True)
class GgmlType:
    """One GGML tensor type: its name, its number in GGUF files (``GGMLQuantizationType``),
    how many weights a block holds and how many bytes it takes."""

    name: str
    gguf_id: int
    block_size: int
    type_size: int


GGML_TYPES: Mapping[str, GgmlType] = types.MappingProxyType(
    {
        t.name: t
        for t in (
            GgmlType("F32", 0, 1, 4),
            GgmlType("F16", 1, 1, 2),
            GgmlType("BF16", 30, 1, 2),
            GgmlType("Q8_0", 8, 32, 34),
            GgmlType("Q4_0", 2, 32, 18),
            GgmlType("Q4_1", 3, 32, 20),
            GgmlType("Q4_K", 12, 256, 144),
            GgmlType("Q5_K", 13, 256, 176),
            GgmlType("Q6_K", 14, 256, 210),
        )
    }
)
"""The supported types by name."""

_BY_ID: Mapping[int, GgmlType] = types.MappingProxyType({t.gguf_id: t for t in GGML_TYPES.values()})
_SUPPORTED = ", ".join(f"{t.name} ({t.gguf_id})" for t in GGML_TYPES.values())
_FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_QUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

TypeLike = str | int | GgmlType


def ggml_type(name_or_id: TypeLike) -> GgmlType:
    """The supported type called ``name_or_id``: a name (``"Q4_K"``, any case), a GGUF type
    number (``12``, or ``gguf.GGMLQuantizationType.Q4_K``), or a ``GgmlType``.

    >>> ggml_type("q4_k"), ggml_type(2).name
    (GgmlType(name='Q4_K', gguf_id=12, block_size=256, type_size=144), 'Q4_0')
    """
    return _resolve(name_or_id)


def _resolve(name_or_id: TypeLike) -> GgmlType:
    if isinstance(name_or_id, GgmlType):
        if GGML_TYPES.get(name_or_id.name) != name_or_id:
            raise ValueError(f"unsupported GGML type {name_or_id!r}; supported: {_SUPPORTED}")
        return name_or_id
    if isinstance(name_or_id, str):
        found = GGML_TYPES.get(name_or_id.upper())
    elif isinstance(name_or_id, int) and not isinstance(name_or_id, bool):
        found = _BY_ID.get(int(name_or_id))
    else:
        raise TypeError(
            f"a GGML type is a name, a GGUF type number or a GgmlType, got {type(name_or_id).__name__} "
            f"{name_or_id!r}; supported: {_SUPPORTED}"
        )
    if found is None:
        raise ValueError(f"unsupported GGML type {name_or_id!r}; supported: {_SUPPORTED}")
    return found


def _count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return int(value)


def row_bytes(ggml_type: TypeLike, k: int) -> int:
    """Bytes of a row of ``k`` weights; ``k`` must be a whole number of blocks.

    >>> row_bytes("Q4_K", 4096)
    2304
    """
    t = _resolve(ggml_type)
    k = _count("row_bytes: k", k)
    if k % t.block_size:
        raise ValueError(
            f"row_bytes: a {t.name} row holds whole blocks of {t.block_size} weights; "
            f"k={k} is not a multiple of {t.block_size}"
        )
    return k // t.block_size * t.type_size


# ---- dequantize ------------------------------------------------------------------------


def _half(b: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at byte ``offset`` of every block of ``b`` ``[R, nb, type_size]``, as
    float32 ``[R, nb]`` (exact)."""
    return b[..., offset : offset + 2].contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``qs`` ``[..., g, n]`` bytes -> ``[..., 2g, n]``: for each group of n bytes, the low
    nibbles (n weights), then the high nibbles (the next n)."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=-2).flatten(-3, -2)


def _k4_scales_mins(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and 8 six-bit mins packed in 12 bytes (``get_scale_min_k4``).

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold
    scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top 2
    bits of bytes 0-3 (scales) and 4-7 (mins).
    """
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    scales = torch.cat((a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)), dim=-1)
    mins = torch.cat((b & 0x3F, (c >> 4) | ((b >> 6) << 4)), dim=-1)
    return scales, mins


def _dequantize_q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 0)
    q = b[..., 2:34].contiguous().view(torch.int8).float()
    return q * d[..., None]


def _dequantize_q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 0)
    q = _nibbles(b[..., None, 2:18]).flatten(-2).to(torch.int16) - 8
    return q.float() * d[..., None]


def _dequantize_q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _half(b, 0), _half(b, 2)
    q = _nibbles(b[..., None, 4:20]).flatten(-2)
    return q.float() * d[..., None] + m[..., None]


def _dequantize_q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _half(b, 0), _half(b, 2)
    scales, mins = _k4_scales_mins(b[..., 4:16])
    q = _nibbles(b[..., 16:144].unflatten(-1, (4, 32)))  # [R, nb, 8 sub-blocks, 32]
    d1 = d[..., None] * scales.float()
    m1 = dmin[..., None] * mins.float()
    return (d1[..., None] * q.float() - m1[..., None]).flatten(-2)


def _dequantize_q5_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _half(b, 0), _half(b, 2)
    scales, mins = _k4_scales_mins(b[..., 4:16])
    low = _nibbles(b[..., 48:176].unflatten(-1, (4, 32)))  # [R, nb, 8, 32]
    bit = torch.arange(8, dtype=torch.uint8, device=b.device)[:, None]
    high = (b[..., None, 16:48] >> bit) & 1  # sub-block s takes bit s of qh[l]
    q = low | (high << 4)
    d1 = d[..., None] * scales.float()
    m1 = dmin[..., None] * mins.float()
    return (d1[..., None] * q.float() - m1[..., None]).flatten(-2)


def _dequantize_q6_k(b: torch.Tensor) -> torch.Tensor:
    # Each half of 128 weights: 64 ql bytes and 32 qh bytes. Quarter j (32 weights) takes
    # the low nibbles of ql[0:32] (j=0), ql[32:64] (j=1), then their high nibbles (j=2, 3),
    # and bits 2j, 2j+1 of qh[l] as its top 2 bits.
    ql = b[..., 0:128].unflatten(-1, (2, 2, 32))  # [R, nb, half, ql group, 32]
    low = torch.stack((ql & 0x0F, ql >> 4), dim=-3).flatten(-3, -2)  # [R, nb, half, quarter, 32]
    shift = torch.arange(0, 8, 2, dtype=torch.uint8, device=b.device)[:, None]
    high = (b[..., 128:192].unflatten(-1, (2, 1, 32)) >> shift) & 3
    q = (low | (high << 4)).to(torch.int16) - 32
    scales = b[..., 192:208].contiguous().view(torch.int8).float()  # one per 16 weights
    d = _half(b, 208)
    ds = d[..., None] * scales  # [R, nb, 16]
    return (ds[..., None] * q.flatten(-3).unflatten(-1, (16, 16)).float()).flatten(-2)


_DEQUANTIZE = {
    "Q8_0": _dequantize_q8_0,
    "Q4_0": _dequantize_q4_0,
    "Q4_1": _dequantize_q4_1,
    "Q4_K": _dequantize_q4_k,
    "Q5_K": _dequantize_q5_k,
    "Q6_K": _dequantize_q6_k,
}


def dequantize(blocks: torch.Tensor, ggml_type: TypeLike) -> torch.Tensor:
    """float32 ``[..., k]`` weights from uint8 ``[..., row_bytes(type, k)]`` rows of blocks.

    Exact and bit-identical to llama.cpp's ``dequantize_row_*`` (see the module's
    docstring); runs on ``blocks``' device, all rows and blocks at once. Non-finite
    float16 scales give what IEEE float32 arithmetic gives (inf, nan).
    """
    t = _resolve(ggml_type)
    if not isinstance(blocks, torch.Tensor):
        raise TypeError(f"dequantize: blocks must be a torch.Tensor, got {type(blocks).__name__}")
    if blocks.dtype != torch.uint8:
        raise ValueError(f"dequantize: {t.name} blocks must be a uint8 tensor of raw bytes, got {blocks.dtype}")
    if blocks.dim() == 0:
        raise ValueError(f"dequantize: {t.name} blocks must have a last dimension of bytes, got a 0-dim tensor")
    lead, nbytes = tuple(blocks.shape[:-1]), blocks.shape[-1]
    if nbytes % t.type_size:
        raise ValueError(
            f"dequantize: a {t.name} row is whole blocks of {t.type_size} bytes ({t.block_size} weights each); "
            f"the last dimension, {nbytes} bytes, is not a multiple of {t.type_size}"
        )
    nb = nbytes // t.type_size
    k = nb * t.block_size
    if t.name in _FLOAT_DTYPES:
        out = torch.empty((*lead, k), dtype=_FLOAT_DTYPES[t.name], device=blocks.device)
        out.view(torch.uint8).copy_(blocks)
        return out if t.name == "F32" else out.float()
    b = blocks.reshape(math.prod(lead), nb, t.type_size)
    return _DEQUANTIZE[t.name](b).reshape(*lead, k)


# ---- quantize --------------------------------------------------------------------------


def _div(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """``x / divisor`` correctly rounded on every device: a tensor divisor, since a CPU
    scalar divisor is turned into a multiplication by its reciprocal on CUDA."""
    return x / torch.full_like(x, divisor)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``d ? 1.0f/d : 0.0f``."""
    return torch.where(d != 0, torch.reciprocal(d), torch.zeros_like(d))


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf`` (halves away from zero), exactly: ``floor(|x| + 0.5)`` would round
    0.49999997 up."""
    a = x.abs()
    whole = a.floor()
    return (whole + (a - whole >= 0.5).to(x.dtype)).copysign(x)


def _half_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[R, nb, 1]`` -> its float16 (round to nearest even, as
    ``GGML_FP32_TO_FP16``) as bytes ``[R, nb, 2]``."""
    return x.to(torch.float16).view(torch.uint8)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[R, nb, 32]`` values 0-15 -> 16 bytes: weight j low, weight j + 16 high."""
    return q[..., :16] | (q[..., 16:] << 4)


def _quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().amax(dim=-1, keepdim=True)
    d = _div(amax, 127.0)
    q = _round_half_away(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat((_half_bytes(d), q), dim=-1)


def _quantize_q4_0(x: torch.Tensor) -> torch.Tensor:
    # The weight of largest magnitude (the first, on a tie) keeps its sign: it maps to -8.
    top = x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))
    d = _div(top, -8.0)
    q = torch.trunc(x * _inverse(d) + 8.5).clamp(0, 15).to(torch.uint8)
    return torch.cat((_half_bytes(d), _pack_nibbles(q)), dim=-1)


def _quantize_q4_1(x: torch.Tensor) -> torch.Tensor:
    lo, hi = x.aminmax(dim=-1, keepdim=True)
    d = _div(hi - lo, 15.0)
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 15).to(torch.uint8)
    return torch.cat((_half_bytes(d), _half_bytes(lo), _pack_nibbles(q)), dim=-1)


_QUANTIZE = {"Q8_0": _quantize_q8_0, "Q4_0": _quantize_q4_0, "Q4_1": _quantize_q4_1}


def quantize(weights: torch.Tensor, ggml_type: TypeLike) -> torch.Tensor:
    """uint8 ``[..., row_bytes(type, k)]`` blocks of float ``[..., k]`` weights, for
    F32, F16, BF16, Q8_0, Q4_0 and Q4_1.

    The weights are taken as float32 first; the block types follow llama.cpp's reference
    quantizers and need finite weights. Q8_0: ``d = amax / 127``, ``q = roundf(x / d)``.
    Q4_0: ``d = max / -8`` where ``max`` is the weight of largest magnitude, with its
    sign, ``q = min(15, trunc(x / d + 8.5))``. Q4_1: ``d = (max - min) / 15``,
    ``m = min``, ``q = min(15, trunc((x - min) / d + 0.5))``. (``/ d`` is ``* (1 / d)``,
    0 where ``d`` is 0.)
    """
    t = _resolve(ggml_type)
    if t.name not in _QUANTIZABLE:
        raise ValueError(
            f"quantize: {t.name} is not supported (llama.cpp quantizes the K-quants by a search, not a "
            f"reference rule); quantize supports {', '.join(_QUANTIZABLE)}; use random_blocks for valid "
            f"{t.name} blocks"
        )
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"quantize: weights must be a torch.Tensor, got {type(weights).__name__}")
    if not weights.is_floating_point():
        raise ValueError(f"quantize: weights must be a floating-point tensor, got {weights.dtype}")
    if weights.dim() == 0:
        raise ValueError("quantize: weights must have a last dimension of k weights, got a 0-dim tensor")
    lead, k = tuple(weights.shape[:-1]), weights.shape[-1]
    if k % t.block_size:
        raise ValueError(
            f"quantize: a {t.name} row holds whole blocks of {t.block_size} weights; "
            f"k={k} (the last dimension) is not a multiple of {t.block_size}"
        )
    x = weights.float()
    if t.name in _FLOAT_DTYPES:
        return x.to(_FLOAT_DTYPES[t.name]).contiguous().view(torch.uint8).clone()
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"quantize: {t.name} needs finite weights; these hold inf or nan")
    nb = k // t.block_size
    out = _QUANTIZE[t.name](x.reshape(math.prod(lead), nb, t.block_size))
    return out.reshape(*lead, nb * t.type_size)


# ---- random blocks ---------------------------------------------------------------------

# Standard deviation of the integer part of a K-quant weight over uniformly random fields,
# in units of d, with dmin = d * _MIN_RATIO (which centres the weights on 0):
# Q4_K: sc*q - 7.5*m (sc, m in 0..63, q in 0..15); Q5_K: sc*q - 15.5*m (q in 0..31);
# Q6_K: sc*(q - 32) (sc in -128..127, q in 0..63).
_UNIT = {"Q4_K": 258.3, "Q5_K": 526.9, "Q6_K": 1366.0}
_MIN_RATIO = {"Q4_K": 7.5, "Q5_K": 15.5}


def random_blocks(
    ggml_type: TypeLike,
    shape_rows: tuple[int, ...],
    k: int,
    generator: torch.Generator,
    scale: float = 0.02,
) -> torch.Tensor:
    """Valid random blocks, uint8 ``[*shape_rows, row_bytes(type, k)]`` on the generator's
    device, whose dequantized weights have a standard deviation of about ``scale``.

    F32/F16/BF16/Q8_0/Q4_0/Q4_1 quantize normal weights of that deviation. The K-quants
    take every packed field at random (6-bit scales and mins, quants, high bits: all of
    their range) and finite float16 ``d`` (and ``dmin``) drawn per block so the weights
    come out near ``scale``, centred on 0 (Q6_K's ``d`` is float16-subnormal for small
    scales, as in real files). The same generator state gives the same blocks.
    """
    t = _resolve(ggml_type)
    if not isinstance(shape_rows, tuple):
        raise TypeError(f"random_blocks: shape_rows must be a tuple of ints, got {type(shape_rows).__name__}")
    rows = tuple(_count("random_blocks: shape_rows entries", n) for n in shape_rows)
    nbytes = row_bytes(t, k)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"random_blocks: generator must be a torch.Generator, got {type(generator).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
        raise ValueError(f"random_blocks: scale must be a finite number > 0, got {scale!r}")
    device = generator.device
    if t.name not in _UNIT:
        w = torch.randn((*rows, k), generator=generator, device=device) * scale
        return quantize(w, t)

    n = math.prod(rows) * (k // t.block_size)

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return torch.rand((n, 1), generator=generator, device=device) * (hi - lo) + lo

    def raw(count: int) -> torch.Tensor:
        return torch.randint(0, 256, (n, count), generator=generator, device=device, dtype=torch.uint8)

    d = uniform(0.75, 1.25) * (scale / _UNIT[t.name])
    parts = [d]
    if t.name in _MIN_RATIO:
        parts.append(uniform(0.75, 1.25) * (scale * _MIN_RATIO[t.name] / _UNIT[t.name]))
    halves = [p.to(torch.float16) for p in parts]
    if not all(bool(torch.isfinite(h).all()) for h in halves):
        raise ValueError(f"random_blocks: scale={scale!r} is too large for {t.name}'s float16 scales")
    half_bytes = [h.view(torch.uint8) for h in halves]
    if t.name == "Q4_K":
        blocks = torch.cat((*half_bytes, raw(12), raw(128)), dim=-1)
    elif t.name == "Q5_K":
        blocks = torch.cat((*half_bytes, raw(12), raw(32), raw(128)), dim=-1)
    else:  # Q6_K: ql, qh, int8 scales, then d
        blocks = torch.cat((raw(128), raw(64), raw(16), *half_bytes), dim=-1)
    return blocks.reshape(*rows, nbytes)
