"""tileops.quant.int4: upstream TileOPs' W4A16 layout (low nibble = even K), its per-group
quantizer, and GPTQ / AWQ checkpoints converted to it, each checked against packing written
out here in the formats' own words."""

from __future__ import annotations

import pytest
import torch

from tileops.quant import int4


def _weights(n: int = 16, k: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


def test_repack_puts_even_k_in_the_low_nibble_and_unpack_inverts_it():
    q = torch.randint(0, 16, (3, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    packed = int4.repack(q)
    assert packed.shape == (3, 4)
    assert int(packed[1, 2]) == int(q[1, 4]) | int(q[1, 5]) << 4
    assert torch.equal(int4.unpack(packed), q)


def test_quantize_follows_upstreams_rule_and_dequantizes_within_half_a_step():
    w = _weights()
    packed, scale, zero = int4.quantize(w, group_size=32)
    assert packed.shape == (16, 32) and scale.shape == zero.shape == (16, 2) and scale.dtype == torch.float32
    groups = w.view(16, 2, 32)
    lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    assert torch.allclose(scale, (hi - lo) / 15)
    assert torch.equal(zero, torch.round(-lo / scale).clamp(0, 15).to(torch.uint8))
    error = (int4.dequantize(packed, scale, zero, 32) - w).abs().view(16, 2, 32)
    assert bool((error <= scale[..., None] * 0.5 + 1e-7).all())


def _pack_along(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """8 4-bit values per int32 along ``dim``: value ``order[i]`` of each 8 at bits 4i."""
    v = values.movedim(dim, -1).to(torch.int64)
    v = v.reshape(*v.shape[:-1], -1, 8)
    word = sum(v[..., order[i]] << (4 * i) for i in range(8))
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    return word.movedim(-1, dim)


@pytest.mark.parametrize("v1", [True, False], ids=["gptq-v1", "gptq-v2"])
def test_a_gptq_linear_converts_to_the_same_weights(v1):
    w = _weights(n=32, k=64)
    packed, scale, zero = int4.quantize(w, group_size=32)
    q = int4.unpack(packed)  # [N, K]
    qweight = _pack_along(q.t(), 0)  # [K / 8, N]
    qzeros = _pack_along(zero.t().to(torch.int64) - (1 if v1 else 0), 1)  # [K / group, N / 8]
    got = int4.from_gptq(qweight, qzeros, scale.t().to(torch.float16), 32, g_idx=torch.arange(64) // 32, v1=v1)
    assert torch.equal(got[0], packed) and torch.equal(got[2], zero)
    assert torch.equal(got[1], scale.to(torch.float16))


def test_an_awq_linear_converts_to_the_same_weights():
    w = _weights(n=32, k=64, seed=2)
    packed, scale, zero = int4.quantize(w, group_size=32)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    qweight = _pack_along(int4.unpack(packed).t(), 1, order)  # [K, N / 8]
    qzeros = _pack_along(zero.t(), 1, order)  # [K / group, N / 8]
    got = int4.from_awq(qweight, qzeros, scale.t().to(torch.float16), 32)
    assert torch.equal(got[0], packed) and torch.equal(got[2], zero) and torch.equal(got[1], scale.to(torch.float16))


def test_what_cannot_be_converted_is_refused_by_name():
    q = torch.zeros(8, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="act-order groups"):
        int4.from_gptq(q, torch.zeros(4, 1, dtype=torch.int32), torch.ones(4, 4), 16, g_idx=torch.arange(64) % 4)
    with pytest.raises(ValueError, match="4-bit checkpoints only"):
        int4.from_gptq(q, q, q, 16, bits=8)
    with pytest.raises(ValueError, match="expected 4-bit values"):
        int4.repack(torch.full((1, 2), 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of group_size=128"):
        int4.quantize(torch.zeros(2, 96))
