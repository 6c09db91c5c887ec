"""4-bit weights in groups along K, as upstream TileOPs' ``GemmW4A16FwdOp`` takes them, and
the conversions from GPTQ and AWQ checkpoints.

The layout (``GemmW4A16FwdOp``): ``packed_weight`` uint8 ``[N, K / 2]``, the 4-bit value of
K index 2i in the low nibble of byte i and 2i + 1 in the high one (``repack``);
``weight_scale`` ``[N, K / group_size]`` and ``weight_zero`` uint8 ``[N, K / group_size]``
(each 0..15); a weight is ``(q - zero) * scale``.
"""

from __future__ import annotations

import torch

__all__ = ["dequantize", "from_awq", "from_gptq", "quantize", "repack", "unpack"]

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds column 8j + _AWQ_ORDER[i]


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(what)


def repack(q: torch.Tensor) -> torch.Tensor:
    """4-bit values ``q`` (uint8 ``[N, K]``, each 0..15, K even) -> ``packed_weight``
    ``[N, K / 2]`` in the order the op reads: K index 2i low, 2i + 1 high."""
    _expect(
        q.dtype == torch.uint8 and q.ndim == 2 and q.shape[1] % 2 == 0,
        f"repack: expected uint8 [N, K] with K even, got {q.dtype} {tuple(q.shape)}",
    )
    _expect(bool((q < 16).all()), "repack: expected 4-bit values 0..15, got larger ones")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """``packed_weight`` ``[N, K / 2]`` -> the 4-bit values uint8 ``[N, K]``."""
    _expect(
        packed.dtype == torch.uint8 and packed.ndim == 2,
        f"unpack: expected uint8 [N, K / 2], got {packed.dtype} {tuple(packed.shape)}",
    )
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float32 weights ``[N, K]``: ``(q - zero) * scale``, groups of ``group_size`` along K."""
    q = unpack(packed).to(torch.float32)
    n, k = q.shape
    _expect(
        k % group_size == 0 and tuple(scale.shape) == (n, k // group_size) == tuple(zero.shape),
        f"dequantize: expected scale and zero [{n}, {k} // {group_size}], got {tuple(scale.shape)} and "
        f"{tuple(zero.shape)}",
    )
    groups = q.view(n, k // group_size, group_size)
    return ((groups - zero.to(torch.float32)[..., None]) * scale.to(torch.float32)[..., None]).view(n, k)


def quantize(weight: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's per-group asymmetric quantizer: each group's range, widened to hold 0,
    spread over 0..15; ``zero = round(-lo / scale)``, ``q = clamp(round(w / scale) + zero,
    0, 15)``. Returns (``packed_weight``, ``weight_scale`` float32, ``weight_zero``)."""
    _expect(
        weight.ndim == 2 and weight.shape[1] % group_size == 0,
        f"quantize: expected [N, K] with K a multiple of group_size={group_size}, got {tuple(weight.shape)}",
    )
    n, k = weight.shape
    w = weight.to(torch.float32).view(n, k // group_size, group_size)
    lo = w.amin(dim=-1).clamp(max=0.0)
    hi = w.amax(dim=-1).clamp(min=0.0)
    scale = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)  # a group of zeros keeps scale > 0
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(w / scale[..., None]) + zero[..., None]).clamp(0, 15).to(torch.uint8).view(n, k)
    return repack(q), scale, zero.to(torch.uint8)


def _nibbles(words: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 words holding 8 4-bit values each -> uint8 values, unpacked along ``dim``
    (value ``order[i]`` of a word at bits 4i)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    parts = [(w >> (4 * i)) & 0xF for i in range(8)]
    out = [None] * 8
    for i, position in enumerate(order):
        out[position] = parts[i]
    stacked = torch.stack(out, dim=dim + 1)  # [..., words, 8, ...] along dim
    shape = list(words.shape)
    shape[dim] *= 8
    return stacked.reshape(shape).to(torch.uint8)


def from_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    *,
    g_idx: torch.Tensor | None = None,
    bits: int = 4,
    v1: bool = True,
) -> tuple[torch.Tensor, ...]:
    """A GPTQ linear (``qweight`` int32 ``[K / 8, N]`` packed along K, ``qzeros`` int32
    ``[K / group, N / 8]`` packed along N, ``scales`` ``[K / group, N]``; the v1 format
    stores zero - 1) -> (``packed_weight``, ``weight_scale``, ``weight_zero``)."""
    _expect(bits == 4, f"from_gptq: 4-bit checkpoints only, got bits={bits}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    _expect(
        k % group_size == 0 and tuple(scales.shape) == (k // group_size, n),
        f"from_gptq: scales must be [K / group_size, N] = [{k // group_size}, {n}], got {tuple(scales.shape)}",
    )
    if g_idx is not None:
        in_order = torch.arange(k, device=g_idx.device) // group_size
        _expect(
            torch.equal(g_idx.to(torch.int64), in_order),
            "from_gptq: act-order groups (desc_act, g_idx not k // group_size) are not served",
        )
    q = _nibbles(qweight, 0).t().contiguous()  # [N, K]
    zeros = _nibbles(qzeros, 1).to(torch.int16) + (1 if v1 else 0)  # [K / group, N]
    _expect(bool((zeros <= 15).all()), "from_gptq: a zero point past 15 (is this a gptq_v2 checkpoint? pass v1=False)")
    return repack(q), scales.t().contiguous(), zeros.to(torch.uint8).t().contiguous()


def from_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, ...]:
    """An AWQ GEMM linear (``qweight`` int32 ``[K, N / 8]`` and ``qzeros`` int32
    ``[K / group, N / 8]``, packed along N in AWQ's nibble order; ``scales``
    ``[K / group, N]``) -> (``packed_weight``, ``weight_scale``, ``weight_zero``)."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    _expect(
        k % group_size == 0 and tuple(scales.shape) == (k // group_size, n),
        f"from_awq: scales must be [K / group_size, N] = [{k // group_size}, {n}], got {tuple(scales.shape)}",
    )
    q = _nibbles(qweight, 1, _AWQ_ORDER).t().contiguous()  # [N, K]
    zeros = _nibbles(qzeros, 1, _AWQ_ORDER)  # [K / group, N]
    return repack(q), scales.t().contiguous(), zeros.t().contiguous()
