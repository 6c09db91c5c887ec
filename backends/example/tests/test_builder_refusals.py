"""A builder called directly (as tests, benchmarks and ``tileops check --device`` call
them) refuses what its kernel cannot compute, before any kernel exists, naming what it
expected, what arrived and what to do: a TypeError for a dtype, a ValueError otherwise."""

from __future__ import annotations

import pytest
import tileops_cpu
import torch

from tileops.backend import TensorSpec

CPU = torch.device("cpu")


def _spec(*shape, dtype=torch.bfloat16, device=CPU):
    return TensorSpec(torch.device(device), dtype, tuple(shape))


def test_a_tensor_on_another_device_is_refused_naming_the_device_and_the_way_out():
    with pytest.raises(ValueError) as caught:
        tileops_cpu.build_rms_norm(_spec(2, 8, device="meta"), _spec(8), normalized_shape=(8,), eps=1e-6)
    assert str(caught.value) == (
        "torch_cpu RMSNormFwdOp: expected every tensor on the CPU; got x on meta; torch_cpu "
        "serves CPU devices only: pass target= a backend that serves meta"
    )


def test_a_dtype_the_kernel_does_not_compute_is_a_type_error():
    with pytest.raises(TypeError) as caught:
        tileops_cpu.build_gemm(_spec(2, 8, dtype=torch.float32), _spec(3, 8), trans_a=False, trans_b=True)
    assert str(caught.value) == (
        "torch_cpu GemmFwdOp: expected a of float16 | bfloat16; got float32; cast it to one of those"
    )
    with pytest.raises(TypeError, match="expected b of a's dtype bfloat16; got float16"):
        tileops_cpu.build_gemm(_spec(2, 8), _spec(3, 8, dtype=torch.float16), trans_a=False, trans_b=True)


def test_a_rotary_dim_wider_than_the_head_is_refused():
    x, positions = _spec(4, 2, 16), _spec(4, dtype=torch.int64)
    with pytest.raises(ValueError) as caught:
        tileops_cpu.build_rope_neox_position_ids(x, positions, max_position=64, rotary_dim=32)
    assert str(caught.value).startswith(
        "torch_cpu RopeNeoxPositionIdsFwdOp: expected rotary_dim even and in (0, head_dim], "
        "max_position > 0; got rotary_dim=32, head_dim=16, max_position=64; "
    )


def test_query_heads_that_are_no_multiple_of_the_kv_heads_are_refused():
    cu = _spec(3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"H a multiple of H_kv; got q \(8, 5, 16\), k \(8, 2, 16\)"):
        tileops_cpu.build_gqa_prefill(
            _spec(8, 5, 16),
            _spec(8, 2, 16),
            _spec(8, 2, 16),
            cu,
            cu,
            max_seqlen_q=8,
            max_seqlen_kv=8,
        )


def test_paged_pools_whose_rows_are_not_whole_pages_are_refused():
    q, kv = _spec(4, 4, 8), _spec(4, 2, 8)
    pools = _spec(30, 2, 8)  # 30 rows: not a whole number of pages of 16
    tables = (
        _spec(3, dtype=torch.int32),
        _spec(2, dtype=torch.int32),
        _spec(2, 4, dtype=torch.int32),
    )
    with pytest.raises(ValueError, match=r"pools \[pages \* page_size, 2, 8\]; got .*page_size=16"):
        tileops_cpu.build_gqa_prefill_paged(
            q,
            kv,
            kv,
            pools,
            pools,
            None,
            None,
            *tables,
            max_pages_per_req=4,
            page_size=16,
            max_seqlen_q=4,
        )


def test_an_moe_activation_the_kernel_lacks_is_refused_naming_the_ones_it_has():
    with pytest.raises(ValueError, match=r"activation in \['gelu_and_mul', 'silu_and_mul'\]"):
        tileops_cpu.build_fused_moe(
            _spec(2, 8),
            _spec(2, 4, dtype=torch.float32),
            _spec(4, 6, 8),
            _spec(4, 8, 3),
            None,
            num_tokens=2,
            num_experts=4,
            top_k=2,
            hidden_size=8,
            ffn_size=3,
            activation="relu_and_mul",
        )


def test_a_correction_bias_without_sigmoid_scoring_is_refused():
    with pytest.raises(ValueError, match="correction_bias \\[4\\] with scoring_func='sigmoid'"):
        tileops_cpu.build_fused_topk(_spec(2, 4), _spec(4, dtype=torch.float32), top_k=2)


def test_what_a_builder_accepts_it_builds_without_touching_any_tensor():
    kernel = tileops_cpu.build_rope_longrope_position_ids(
        _spec(3, 2, 16),
        _spec(3, dtype=torch.int32),
        max_position=32,
        rotary_dim=8,
        rescale_factors=(1.0, 2.0, 3.0, 4.0),
        max_position_embeddings=64,
        original_max_position_embeddings=16,
    )
    assert type(kernel).__name__ == "CpuRopePositionIds"
    assert kernel.rotary_dim == 8 and kernel.factor == pytest.approx(1.5**0.5)  # sqrt(1 + ln 4 / ln 16)
