"""The references every backend is judged by (tileops.testing.references) and their
tolerances."""

from __future__ import annotations

import pytest
import torch

from tileops.testing.references import reference, tolerance

from ._common import BF16, F16, F32


def test_tolerances_are_tightest_for_float32_and_exact_for_integers() -> None:
    assert tolerance(torch.int32) == (0.0, 0.0) and tolerance(torch.bool) == (0.0, 0.0)
    f32, f16, bf16 = tolerance(F32), tolerance(F16), tolerance(BF16)
    assert f32 < f16 and f16[0] <= bf16[0] and f16[1] <= bf16[1]
    with pytest.raises(ValueError):
        tolerance(torch.float64)


def test_reference_for_an_unknown_op_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="NoSuchOp"):
        reference("NoSuchOp")


def test_references_compute_in_float32_and_return_the_input_dtype() -> None:
    x = torch.randn(4, 64).to(BF16)
    w = torch.randn(64).to(BF16)
    out = reference("RMSNormFwdOp")(x, w, normalized_shape=(64,), eps=1e-6)
    xf = x.float()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    assert out.dtype == BF16
    assert torch.equal(out, expected.to(BF16))


def test_fused_add_rmsnorm_reference_normalises_the_sum_and_returns_it() -> None:
    x, r, w = (torch.randn(3, 32, dtype=F32) for _ in range(3))
    w = w[0]
    out, res = reference("FusedAddRMSNormFwdOp")(x, r, w, eps=1e-6)
    assert torch.equal(res, x + r)
    rtol, atol = tolerance(F32)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x + r, (32,), w, 1e-6), rtol=rtol, atol=atol)


def test_gemm_reference_applies_the_transpose_flags() -> None:
    a, b = torch.randn(8, 4), torch.randn(6, 8)
    out = reference("GemmFwdOp")(a, b, trans_a=True, trans_b=True)
    torch.testing.assert_close(out, a.T @ b.T)


def test_silu_and_mul_reference_gates_with_the_first_half() -> None:
    x = torch.randn(3, 8)
    torch.testing.assert_close(reference("SiluAndMulFwdOp")(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_inplace_activation_references_write_their_input() -> None:
    x = torch.randn(5)
    expected = torch.relu(x)
    out = reference("ReluFwdOp")(x, inplace=True)
    assert out is x and torch.equal(x, expected)
    y = torch.randn(5)
    before = y.clone()
    reference("SiluFwdOp")(y, inplace=False)
    assert torch.equal(y, before)


def test_rope_reference_is_the_identity_at_position_zero_and_keeps_pair_norms() -> None:
    x = torch.randn(6, 16)
    y = reference("RopeNeoxFwdOp")(x, layout="1d", base=10000.0)
    assert torch.equal(y[0], x[0])

    def pair_norms(t: torch.Tensor) -> torch.Tensor:
        return t[..., :8] ** 2 + t[..., 8:] ** 2

    torch.testing.assert_close(pair_norms(y), pair_norms(x))
    x2 = x.view(1, 6, 1, 16)
    assert torch.equal(reference("RopeNeoxFwdOp")(x2, layout="2d", base=10000.0).view(6, 16), y)


def test_rope_position_ids_reference_agrees_with_rope_at_the_same_positions() -> None:
    x = torch.randn(6, 2, 16)
    ref = reference("RopeNeoxPositionIdsFwdOp")
    pos = torch.arange(6, dtype=torch.int64)
    y = ref(x, pos, max_position=64, base=10000.0, rotary_dim=16)
    for h in range(2):
        assert torch.equal(y[:, h], reference("RopeNeoxFwdOp")(x[:, h], layout="1d", base=10000.0))
    # Partial rotary: the tail passes through; tokens in any order use their own position.
    shuffled = torch.tensor([5, 0, 3, 3, 1, 2], dtype=torch.int32)
    z = ref(x, shuffled, max_position=64, base=10000.0, rotary_dim=8)
    assert torch.equal(z[..., 8:], x[..., 8:])
    assert torch.equal(z[1, :, :8], x[1, :, :8])  # position 0
    alone = ref(x[2:3], torch.tensor([3]), max_position=64, base=10000.0, rotary_dim=8)
    assert torch.equal(z[2], alone[0])
    with pytest.raises(ValueError, match="position_ids"):
        ref(x, pos + 60, max_position=64, base=10000.0, rotary_dim=8)


def test_gqa_decode_reference_agrees_with_sdpa_on_one_query() -> None:
    q, k, v = torch.randn(2, 8, 16), torch.randn(2, 5, 2, 16), torch.randn(2, 5, 2, 16)
    out = reference("GroupedQueryAttentionDecodeWithKVCacheFwdOp")(q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True
    )[:, :, 0]
    torch.testing.assert_close(out, expected)


def test_gqa_references_written_out_softcap_path_matches_sdpa_when_the_cap_is_huge() -> None:
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 8)
    ref = reference("GroupedQueryAttentionFwdOp")
    for causal in (True, False):
        torch.testing.assert_close(
            ref(q, k, v, is_causal=causal, softcap=1e9),
            ref(q, k, v, is_causal=causal),
            rtol=1e-5,
            atol=1e-5,
        )
    capped = ref(q, k, v, is_causal=True, softcap=0.01)
    assert not torch.allclose(capped, ref(q, k, v, is_causal=True))
