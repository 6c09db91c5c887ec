"""What the builders refuse (what their op's manifest does not accept), each refusal naming
what was expected and what arrived; and what they serve since they accept everything the
manifest does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import Spec, close, run, sdpa_ref
from tileops_native_cpu import builders as b

BF16, F32 = torch.bfloat16, torch.float32


def s(*shape: int, dtype: torch.dtype = BF16) -> Spec:
    return Spec(torch.device("cpu"), dtype, tuple(shape))


# (builder, inputs, params, error type, what the message says)
REFUSALS = {
    "rmsnorm_of_float32_which_its_manifest_does_not_list": (
        b.build_rms_norm,
        [s(4, 8, dtype=F32), s(8, dtype=F32)],
        dict(normalized_shape=(8,), eps=1e-6),
        TypeError,
        r"x must be one of the dtypes its manifest lists \(float16, bfloat16\); got x of float32",
    ),
    "rmsnorm_with_a_weight_not_shaped_like_normalized_shape": (
        b.build_rms_norm,
        [s(4, 2, 8), s(16)],
        dict(normalized_shape=(2, 8), eps=1e-6),
        ValueError,
        r"weight must have shape normalized_shape=\(2, 8\); got weight of shape \(16,\)",
    ),
    "rmsnorm_with_an_empty_normalized_shape": (
        b.build_rms_norm,
        [s(4, 8), s()],
        dict(normalized_shape=(), eps=1e-6),
        ValueError,
        "must not be empty",
    ),
    "fused_add_rmsnorm_of_float32": (
        b.build_fused_add_rms_norm,
        [s(4, 8, dtype=F32)] * 2 + [s(8, dtype=F32)],
        dict(eps=1e-6),
        TypeError,
        "float32",
    ),
    "fused_add_rmsnorm_with_a_residual_of_another_shape": (
        b.build_fused_add_rms_norm,
        [s(4, 8), s(1, 8), s(8)],
        dict(eps=1e-6),
        ValueError,
        r"residual must have x's shape \(4, 8\); got residual of shape \(1, 8\)",
    ),
    "fused_add_rmsnorm_with_a_weight_of_another_size": (
        b.build_fused_add_rms_norm,
        [s(4, 8), s(4, 8), s(4)],
        dict(eps=1e-6),
        ValueError,
        r"weight must have shape \(8,\); got weight of shape \(4,\)",
    ),
    "layernorm_with_a_bias_not_shaped_like_normalized_shape": (
        b.build_layer_norm,
        [s(4, 8), s(8), s(1, 8)],
        dict(normalized_shape=(8,), eps=1e-5),
        ValueError,
        r"bias must have shape normalized_shape=\(8,\); got bias of shape \(1, 8\)",
    ),
    "groupnorm_with_a_weight_that_is_not_one_per_channel": (
        b.build_group_norm,
        [s(2, 6, 4), s(3), s(3)],
        dict(num_groups=3, eps=1e-5),
        ValueError,
        r"weight must have shape \(C,\) = \(6,\); got weight of shape \(3,\)",
    ),
    "groupnorm_whose_only_group_holds_a_single_value": (
        b.build_group_norm,
        [s(1, 2, 1), None, None],
        dict(num_groups=2, eps=1e-5),
        ValueError,
        "exactly one value",
    ),
    "sum_over_a_dim_named_twice": (
        b.build_sum,
        [s(4, 8)],
        dict(dim=(0, -2), keepdim=False),
        ValueError,
        r"dims must not repeat; got dim=\(0, -2\)",
    ),
    "gemm_of_float32": (
        b.build_gemm,
        [s(4, 8, dtype=F32), s(8, 8, dtype=F32)],
        dict(trans_a=False, trans_b=True),
        TypeError,
        "float32",
    ),
    "bmm_of_float32": (b.build_bmm, [s(2, 4, 16, dtype=F32), s(2, 16, 8, dtype=F32)], {}, TypeError, "float32"),
    "bmm_whose_k_is_not_a_multiple_of_16": (
        b.build_bmm,
        [s(2, 4, 70), s(2, 70, 8)],
        {},
        ValueError,
        "K must be a multiple of 16; got K=70",
    ),
    "add_of_integers_with_a_float_alpha_even_a_whole_one": (
        b.build_add,
        [s(3, dtype=torch.int32)] * 2,
        dict(alpha=2.0),
        ValueError,
        "alpha must be an int for int32 tensors; got alpha=2.0",
    ),
    "add_with_an_alpha_int8_cannot_hold": (
        b.build_add,
        [s(3, dtype=torch.int8)] * 2,
        dict(alpha=300),
        ValueError,
        "representable in int8; got alpha=300",
    ),
    "add_with_an_alpha_float16_cannot_hold": (
        b.build_add,
        [s(3, dtype=torch.float16)] * 2,
        dict(alpha=1e6),
        ValueError,
        "representable in float16",
    ),
    "add_with_a_bool_alpha": (
        b.build_add,
        [s(3, dtype=torch.int32)] * 2,
        dict(alpha=True),
        ValueError,
        "alpha must be an int or a float",
    ),
    "silu_and_mul_of_a_3d_x": (
        b.build_silu_and_mul,
        [s(3, 2, 8)],
        {},
        ValueError,
        r"x must be \[M, 2N\].*; got x of shape \(3, 2, 8\)",
    ),
    "silu_and_mul_of_a_1d_x": (b.build_silu_and_mul, [s(8)], {}, ValueError, r"x must be \[M, 2N\]"),
    "rope_with_position_ids_without_rotary_dim": (
        b.build_rope_neox_position_ids,
        [s(4, 2, 8), s(4, dtype=torch.int64)],
        dict(max_position=16),
        TypeError,
        "rotary_dim",
    ),
    "rope_with_position_ids_not_one_per_token": (
        b.build_rope_neox_position_ids,
        [s(4, 2, 8), s(4, 1, dtype=torch.int64)],
        dict(max_position=16, rotary_dim=8),
        ValueError,
        r"position_ids must have shape \(4,\), one per token of x; got position_ids of shape \(4, 1\)",
    ),
    "gqa_of_float32": (b.build_gqa, [s(1, 4, 2, 8, dtype=F32)] * 3, dict(is_causal=True), TypeError, "float32"),
    "gqa_whose_keys_have_another_sequence_length": (
        b.build_gqa,
        [s(1, 4, 2, 8), s(1, 5, 2, 8), s(1, 5, 2, 8)],
        dict(is_causal=True),
        ValueError,
        "k and v must have q's sequence length",
    ),
    "gqa_whose_keys_have_another_batch": (
        b.build_gqa,
        [s(1, 4, 2, 8), s(2, 4, 2, 8), s(2, 4, 2, 8)],
        dict(is_causal=True),
        ValueError,
        "expected q",
    ),
    "gqa_decode_of_float32": (
        b.build_gqa_decode,
        [s(1, 2, 8, dtype=F32)] + [s(1, 3, 2, 8, dtype=F32)] * 2,
        {},
        TypeError,
        "float32",
    ),
    "gqa_decode_against_an_empty_cache": (
        b.build_gqa_decode,
        [s(1, 2, 8), s(1, 0, 2, 8), s(1, 0, 2, 8)],
        {},
        ValueError,
        r"the cache must hold at least one position; got k of shape \(1, 0, 2, 8\)",
    ),
    "an_input_of_more_dims_than_the_kernels_hold": (
        b.build_silu,
        [s(*[1] * 17)],
        dict(inplace=False),
        ValueError,
        "at most 16 dims are supported",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_builder_refuses(case):
    build, inputs, params, error, message = REFUSALS[case]
    with pytest.raises(error, match=message):
        build(*inputs, **params)


def test_every_refusal_names_the_target_and_the_op():
    for build, inputs, params, error, _ in REFUSALS.values():
        with pytest.raises(error) as refused:
            build(*inputs, **params)
        if "rotary_dim" not in str(refused.value):  # Python's own: a required keyword is missing
            assert str(refused.value).startswith("native_cpu "), refused.value


# -- served because the manifest accepts it (the builders refused these before) ----------


@pytest.mark.parametrize("head_dim", [1040, 1100])
def test_gqa_decode_serves_a_head_dim_above_1024(head_dim):
    q = torch.randn(1, 4, head_dim, dtype=BF16)
    k, v = torch.randn(1, 9, 2, head_dim, dtype=BF16), torch.randn(1, 9, 2, head_dim, dtype=BF16)
    close(run(b.build_gqa_decode, q, k, v), sdpa_ref(q[:, None], k, v, False)[:, 0].to(BF16), scale=3)


def test_gqa_decode_serves_more_than_64_query_heads_per_kv_head():
    q = torch.randn(2, 72, 16, dtype=torch.float16)
    k, v = torch.randn(2, 30, 1, 16, dtype=torch.float16), torch.randn(2, 30, 1, 16, dtype=torch.float16)
    close(run(b.build_gqa_decode, q, k, v), sdpa_ref(q[:, None], k, v, False)[:, 0].to(torch.float16), scale=3)


def test_gqa_serves_a_head_dim_above_1024():
    q, k, v = (torch.randn(1, 5, 2, 1100, dtype=BF16) for _ in range(3))
    close(run(b.build_gqa, q, k, v, is_causal=True), sdpa_ref(q, k, v, True).to(BF16), scale=3)


def test_a_gated_kernel_for_an_activation_the_kernels_lack_is_refused_naming_where_to_add_it(native):
    with pytest.raises(ValueError, match="no 'gated' kernel for bfloat16 and relu"):
        native.gated(native.Activation.relu, native.DType.bfloat16, 1, "test")


def test_the_activation_enum_lists_the_kernels_activations(native):
    assert [a.name for a in native.Activation] == ["silu", "gelu", "gelu_tanh", "relu"]


@pytest.mark.parametrize("kind,ref", [("silu", F.silu)])
def test_the_gated_kernel_is_built_for_an_activation_by_its_enum_member(native, kind, ref):
    x = torch.randn(3, 40, dtype=torch.float16)
    kernel = native.gated(native.Activation[kind], native.DType.float16, 1, "test")
    close(kernel(x), (ref(x[:, :20].float()) * x[:, 20:].float()).to(torch.float16))
