import math

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOATS, HALVES, close, run, sdpa_ref, spec
from tileops_native_cpu import builders as b


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False), (True, True)])
@pytest.mark.parametrize("m,n,k", [(37, 45, 70), (1, 33, 300), (130, 1, 17), (64, 96, 600)])
def test_gemm_matches_matmul_in_every_layout(dtype, trans_a, trans_b, m, n, k):
    a = torch.randn((k, m) if trans_a else (m, k), dtype=dtype)
    bm = torch.randn((n, k) if trans_b else (k, n), dtype=dtype)
    out = run(b.build_gemm, a, bm, trans_a=trans_a, trans_b=trans_b)
    ref = (a.float().T if trans_a else a.float()) @ (bm.float().T if trans_b else bm.float())
    close(out, ref.to(dtype), scale=max(1.0, k**0.5 / 4))


# The packed bfloat16 GEMM works in blocks of 4096 along K and 2048 along N: sizes over one
# block, with odd tails, accumulate across K blocks and store several column blocks.
@pytest.mark.parametrize("trans_b", [False, True])
def test_bf16_gemm_across_k_and_n_blocks(trans_b):
    m, n, k = 300, 2100, 4101
    a = torch.randn(m, k, dtype=torch.bfloat16)
    bm = torch.randn((n, k) if trans_b else (k, n), dtype=torch.bfloat16)
    out = run(b.build_gemm, a, bm, trans_a=False, trans_b=trans_b)
    ref = a.float() @ (bm.float().T if trans_b else bm.float())
    close(out, ref.to(torch.bfloat16), scale=k**0.5 / 4)


# m <= 16 takes the skinny (GEMV) path, which streams B in place: odd K and N off the vector
# width, one column, one K; m up to 16 (groups of 8 rows) against the blocked path at m = 17.
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False), (True, True)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 17])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 1), (1, 45), (131, 77), (33, 1030), (300, 17)])
def test_skinny_gemm_matches_matmul(dtype, trans_a, trans_b, m, n, k):
    a = torch.randn((k, m) if trans_a else (m, k), dtype=dtype)
    bm = torch.randn((n, k) if trans_b else (k, n), dtype=dtype)
    out = run(b.build_gemm, a, bm, trans_a=trans_a, trans_b=trans_b)
    ref = (a.float().T if trans_a else a.float()) @ (bm.float().T if trans_b else bm.float())
    close(out, ref.to(dtype), scale=max(1.0, k**0.5 / 4))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("n,k", [(5632, 1024), (1027, 2819)])
def test_decode_gemv_matches_f_linear(dtype, n, k):
    # the decoder's shape: activation [1, K] x weight [N, K]^T, split over the thread pool
    a, w = torch.randn(1, k, dtype=dtype), torch.randn(n, k, dtype=dtype) * 0.02
    out = run(b.build_gemm, a, w, trans_a=False, trans_b=True)
    close(out, F.linear(a.float(), w.float()).to(dtype), scale=2)


@pytest.mark.parametrize("dtype", HALVES)
def test_bmm_with_one_row_per_batch_matches_torch(dtype):
    a, bm = torch.randn(3, 1, 64, dtype=dtype), torch.randn(3, 64, 45, dtype=dtype)
    close(run(b.build_bmm, a, bm), torch.bmm(a.float(), bm.float()).to(dtype), scale=3)


def test_gemm_refuses_operands_that_disagree_on_k():
    a, bm = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(5, 9, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K=8"):
        b.build_gemm(spec(a), spec(bm), trans_a=False, trans_b=True)


@pytest.mark.parametrize("dtype", HALVES)
def test_bmm_matches_torch(dtype):
    a, bm = torch.randn(3, 17, 32, dtype=dtype), torch.randn(3, 32, 9, dtype=dtype)
    close(run(b.build_bmm, a, bm), torch.bmm(a.float(), bm.float()).to(dtype), scale=2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [2, 3, 4, 9])
@pytest.mark.parametrize("dtype", HALVES)
def test_bmm_is_exact_on_small_integers_however_the_products_share_the_threads(threads, batch, dtype):
    # on 2 threads, 2 and 4 products go whole to each thread, 9 too (unevenly), and 3 run
    # in turn over both threads: a product written to another's output, or computed from
    # another's operands, shows as a difference (each has its own values); 37 rows are not
    # whole micro-tiles, and K = 80 is not whole blocks of 16 K pairs (Bmm's K is a
    # multiple of 16)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for k in (64, 80):
            a = torch.randint(-3, 4, (batch, 37, k)).to(dtype)
            bm = torch.randint(-3, 4, (batch, k, 70)).to(dtype)
            out = run(b.build_bmm, a, bm)
            assert torch.equal(out.double(), torch.bmm(a.double(), bm.double()).to(dtype).double())
    finally:
        torch.set_num_threads(old)


def rope_ref(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_pairs_ref(x, cos, sin):
    """Adjacent pairs (RopeNonNeox): channels 2k and 2k+1 rotate by angle k."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def tables(positions, dim, base, dtype):
    half = dim // 2
    freqs = 1.0 / (base ** (torch.arange(half, dtype=torch.float32) / half))
    ang = torch.outer(positions.float(), freqs)
    return ang.cos().to(dtype).float(), ang.sin().to(dtype).float()


@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_1d_rotates_positions_zero_to_seq_len(dtype):
    x = torch.randn(37, 64, dtype=dtype)
    cos, sin = tables(torch.arange(37), 64, 10000.0, dtype)
    close(run(b.build_rope_neox, x, layout="1d", base=10000.0), rope_ref(x.float(), cos, sin).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_2d_rotates_every_head_of_bshd(dtype):
    x = torch.randn(2, 5, 3, 34, dtype=dtype)
    cos, sin = tables(torch.arange(5), 34, 500.0, dtype)
    ref = rope_ref(x.float(), cos[None, :, None, :], sin[None, :, None, :])
    close(run(b.build_rope_neox, x, layout="2d", base=500.0), ref.to(dtype))


def test_rope_kernel_built_for_a_short_sequence_serves_a_longer_one_once_built_for_it():
    x_short, x_long = torch.randn(4, 16), torch.randn(4000, 16)
    k_short = b.build_rope_neox(spec(x_short), layout="1d", base=10000.0)
    k_long = b.build_rope_neox(spec(x_long), layout="1d", base=10000.0)
    assert k_short is k_long
    cos, sin = tables(torch.arange(4000), 16, 10000.0, torch.float32)
    close(k_long(x_long), rope_ref(x_long, cos, sin), scale=5)
    cos, sin = tables(torch.arange(4), 16, 10000.0, torch.float32)
    close(k_short(x_short), rope_ref(x_short, cos, sin))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rope_with_position_ids_rotates_the_leading_rotary_dims_only(dtype, pos_dtype, rotary_dim):
    x = torch.randn(9, 4, 64, dtype=dtype)
    pos = torch.randint(0, 2048, (9,), dtype=pos_dtype)
    out = run(b.build_rope_neox_position_ids, x, pos, max_position=2048, base=10000.0, rotary_dim=rotary_dim)
    cos, sin = tables(pos, rotary_dim, 10000.0, dtype)
    rot = rope_ref(x[..., :rotary_dim].float(), cos[:, None, :], sin[:, None, :])
    close(out, torch.cat([rot, x[..., rotary_dim:].float()], -1).to(dtype))


# Pairs rotate within a vector (swap_pairs / dup_pairs_* / fmaddsub in the Simd layer): head
# dims below, at and across one and two vector widths, and odd pair counts.
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("head_dim", [2, 6, 16, 18, 32, 34, 64, 98, 130])
def test_rope_pairs_rotate_adjacent_channels_at_every_head_dim(dtype, head_dim):
    x = torch.randn(2, 21, 3, head_dim, dtype=dtype)
    cos, sin = tables(torch.arange(21), head_dim, 10000.0, dtype)
    out = run(b.BUILDERS["RopeNonNeoxFwdOp"], x, layout="2d", base=10000.0)
    close(out, rope_pairs_ref(x.float(), cos[None, :, None, :], sin[None, :, None, :]).to(dtype))
    x1 = x[0, :, 0].contiguous()
    close(
        run(b.BUILDERS["RopeNonNeoxFwdOp"], x1, layout="1d", base=500.0),
        rope_pairs_ref(x1.float(), *tables(torch.arange(21), head_dim, 500.0, dtype)).to(dtype),
    )


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rotary_dim", [64, 34, 2])
def test_rope_pairs_with_position_ids_rotate_the_leading_rotary_dims_only(dtype, rotary_dim):
    x = torch.randn(9, 4, 64, dtype=dtype)
    pos = torch.randint(0, 2048, (9,), dtype=torch.int32)
    out = run(b.BUILDERS["RopeNonNeoxPositionIdsFwdOp"], x, pos, max_position=2048, base=10000.0, rotary_dim=rotary_dim)
    cos, sin = tables(pos, rotary_dim, 10000.0, dtype)
    rot = rope_pairs_ref(x[..., :rotary_dim].float(), cos[:, None, :], sin[:, None, :])
    close(out, torch.cat([rot, x[..., rotary_dim:].float()], -1).to(dtype))


def test_longrope_divides_the_frequencies_by_its_factors_and_scales_cos_and_sin():
    x = torch.randn(300, 64, dtype=torch.float32)
    factors = [1.0 + k / 2 for k in range(32)]
    out = run(
        b.BUILDERS["RopeLongRopeFwdOp"],
        x,
        layout="1d",
        base=10000.0,
        rescale_factors=factors,
        max_position_embeddings=16384,
        original_max_position_embeddings=2048,
    )
    freqs = 1.0 / (10000.0 ** (torch.arange(32, dtype=torch.float32) / 32)) / torch.tensor(factors)
    ang = torch.outer(torch.arange(300).float(), freqs)
    mscale = (1 + math.log(8) / math.log(2048)) ** 0.5
    close(out, rope_ref(x, ang.cos() * mscale, ang.sin() * mscale))


def test_longrope_refuses_rescale_factors_that_are_not_one_per_rotated_pair():
    with pytest.raises(ValueError, match=r"len\(rescale_factors\) == half.*half=32"):
        b.BUILDERS["RopeLongRopeFwdOp"](spec(torch.empty(8, 64)), layout="1d", base=10000.0, rescale_factors=[1.0] * 16)


def test_rope_with_a_position_beyond_max_position_raises_index_error():
    x = torch.randn(2, 1, 8)
    pos = torch.tensor([0, 16])
    with pytest.raises(IndexError, match="got 16"):
        run(b.build_rope_neox_position_ids, x, pos, max_position=16, base=10000.0, rotary_dim=8)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "bshd", [(2, 70, 4, 2, 64), (1, 1, 2, 1, 32), (1, 130, 8, 8, 40), (1, 37, 4, 2, 17), (1, 70, 4, 1, 130)]
)  # odd D; 65 channel pairs
def test_gqa_forward_matches_sdpa(dtype, causal, bshd):
    bsz, s, h, hkv, d = bshd
    q = torch.randn(bsz, s, h, d, dtype=dtype)
    k, v = torch.randn(bsz, s, hkv, d, dtype=dtype), torch.randn(bsz, s, hkv, d, dtype=dtype)
    out = run(b.build_gqa, q, k, v, is_causal=causal)
    close(out, sdpa_ref(q, k, v, causal).to(dtype), scale=3)


@pytest.mark.parametrize("dtype", HALVES)
# odd D, D = 96 and 130 (runs of 32 channels and a partial one), 3 and 6 heads a group
@pytest.mark.parametrize(
    "bnhd",
    [
        (2, 300, 8, 2, 64),
        (1, 1, 4, 4, 128),
        (1, 5000, 8, 1, 32),
        (1, 77, 6, 2, 17),
        (2, 40, 4, 1, 96),
        (1, 33, 12, 2, 130),
    ],
)
def test_gqa_decode_attends_to_every_cached_position(dtype, bnhd):
    bsz, n, h, hkv, d = bnhd
    q = torch.randn(bsz, h, d, dtype=dtype)
    k, v = torch.randn(bsz, n, hkv, d, dtype=dtype), torch.randn(bsz, n, hkv, d, dtype=dtype)
    out = run(b.build_gqa_decode, q, k, v)
    close(out, sdpa_ref(q[:, None], k, v, False)[:, 0].to(dtype), scale=3)


def test_gqa_decode_reuses_one_kernel_as_the_cache_grows():
    q = torch.randn(1, 4, 32, dtype=torch.bfloat16)
    made = {
        id(b.build_gqa_decode(spec(q), *(2 * [spec(torch.empty(1, n, 2, 32, dtype=torch.bfloat16))])))
        for n in range(1, 40)
    }
    assert len(made) == 1


def test_gqa_refuses_heads_that_are_not_a_multiple_of_kv_heads():
    q, k = torch.randn(1, 4, 6, 8, dtype=torch.bfloat16), torch.randn(1, 4, 4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="H=6, H_kv=4"):
        b.build_gqa(spec(q), spec(k), spec(k), is_causal=True)


# bfloat16 NT with 16 < m <= 256 and even K reads the weight in place (AVX-512 BF16): strips
# of 32 rows (a last strip of up to 16 on one vector), tiles of 12 columns (partial last
# tile), K in blocks of 1024 with a remainder, N in blocks of 3072; A row-major or
# transposed (strided packing); m = 257 and odd K take the packed path beside it.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize(
    "m,n,k",
    [
        (17, 12, 2),
        (31, 13, 70),
        (32, 1, 1024),
        (40, 25, 2050),
        (48, 100, 66),
        (128, 3100, 130),
        (256, 37, 3000),
        (257, 40, 64),
        (100, 30, 71),
    ],
)
def test_bf16_nt_gemm_from_the_weight_layout_matches_matmul(threads, trans_a, m, n, k):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn((k, m) if trans_a else (m, k), dtype=torch.bfloat16)
        w = torch.randn(n, k, dtype=torch.bfloat16)
        out = run(b.build_gemm, a, w, trans_a=trans_a, trans_b=True)
    finally:
        torch.set_num_threads(old)
    ref = (a.float().T if trans_a else a.float()) @ w.float().T
    close(out, ref.to(torch.bfloat16), scale=max(1.0, k**0.5 / 4))


def test_bf16_nt_gemm_exact_on_small_integers():
    # integer-valued operands make every product and sum exact in float32: any element
    # computed from the wrong row, column or K pair shows as a difference
    a = torch.randint(-3, 4, (77, 2048)).to(torch.bfloat16)
    w = torch.randint(-3, 4, (3100, 2048)).to(torch.bfloat16)
    out = run(b.build_gemm, a, w, trans_a=False, trans_b=True)
    ref = a.double() @ w.double().T
    assert torch.equal(out.double(), ref.to(torch.bfloat16).double())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [17, 1030, 2819])
def test_batched_decode_gemm_is_exact_on_small_integers(threads, m, k):
    # up to four activation rows stream each weight row once against all of them, and the
    # sums of a block of weight rows are reduced together (301 rows: whole blocks and a
    # tail): an element from the wrong row, a lost K tail or a swapped output row or lane
    # shows as a difference
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randint(-3, 4, (m, k)).to(torch.bfloat16)
        w = torch.randint(-3, 4, (301, k)).to(torch.bfloat16)
        out = run(b.build_gemm, a, w, trans_a=False, trans_b=True)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(out.double(), (a.double() @ w.double().T).to(torch.bfloat16).double())


# A RoPE at explicit positions 0..S-1 is its positional form, head by head: the two
# builders share nothing but the rotation and the scaling's frequencies (tileops.rope_tables).
@pytest.mark.parametrize(
    "op, params",
    [
        ("RopeNonNeox", {}),
        ("RopeLlama31", dict(scale_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=512)),
        ("RopeYarn", dict(scale=4.0, original_max_position=256, beta_fast=32.0, beta_slow=1.0, attn_factor=1.3)),
        (
            "RopeLongRope",
            dict(
                rescale_factors=[1.0 + k / 4 for k in range(64)],
                max_position_embeddings=8192,
                original_max_position_embeddings=1024,
            ),
        ),
    ],
)
def test_scaled_rope_at_positions_matches_its_positional_form(op, params):
    x = torch.randn(300, 128, dtype=torch.float32)
    positional = run(b.BUILDERS[f"{op}FwdOp"], x, layout="1d", base=10000.0, **params)
    at = run(
        b.BUILDERS[f"{op}PositionIdsFwdOp"],
        x[:, None, :],
        torch.arange(300),
        max_position=300,
        base=10000.0,
        rotary_dim=128,
        **params,
    )
    torch.testing.assert_close(at[:, 0, :], positional)
    plain = run(b.build_rope_neox, x, layout="1d", base=10000.0)
    assert not torch.allclose(positional, plain, atol=1e-3)  # the scaling or rotation changed something
