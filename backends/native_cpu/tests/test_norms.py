import pytest
import torch
import torch.nn.functional as F

from conftest import FLOATS, HALVES, close, run, spec
from tileops_native_cpu import builders as b


def rms_ref(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("shape", [(1, 4096), (7, 257), (33, 64), (3, 5, 1000)])
def test_rmsnorm_matches_torch_across_dtypes_and_odd_hidden_sizes(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[-1], dtype=dtype)
    out = run(b.build_rms_norm, x, w, normalized_shape=(shape[-1],), eps=1e-6)
    close(out, F.rms_norm(x, (shape[-1],), w, 1e-6))


def test_rmsnorm_normalizes_over_a_multi_dim_normalized_shape():
    x = torch.randn(2, 3, 4, 9, dtype=torch.bfloat16)
    w = torch.randn(4, 9, dtype=torch.bfloat16)
    out = run(b.build_rms_norm, x, w, normalized_shape=(4, 9), eps=1e-5)
    close(out, F.rms_norm(x.float(), (4, 9), w.float(), 1e-5).to(torch.bfloat16))


@pytest.mark.parametrize("shape", [(3, 0), (0, 8)])
def test_norms_of_tensors_without_elements_return_empty_results_of_their_shape(shape):
    # the manifests accept a hidden size of 0 (and no rows): torch returns empty tensors
    x, r = torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16)
    w, bias = torch.randn(shape[-1], dtype=torch.bfloat16), torch.randn(shape[-1], dtype=torch.bfloat16)
    assert run(b.build_rms_norm, x, w, normalized_shape=(shape[-1],), eps=1e-6).shape == shape
    assert run(b.build_layer_norm, x, w, bias, normalized_shape=(shape[-1],), eps=1e-5).shape == shape
    out, res = run(b.build_fused_add_rms_norm, x, r, w, eps=1e-6)
    assert out.shape == res.shape == shape


def test_rmsnorm_rejects_an_integer_dtype_naming_it():
    x = torch.ones(3, 8, dtype=torch.int32)
    with pytest.raises(TypeError, match="int32"):
        b.build_rms_norm(spec(x), spec(x[0]), normalized_shape=(8,), eps=1e-6)


def test_rmsnorm_output_is_fresh_and_never_aliases_the_input():
    x = torch.randn(4, 64, dtype=torch.float16)
    w = torch.randn(64, dtype=torch.float16)
    out = run(b.build_rms_norm, x, w, normalized_shape=(64,), eps=1e-6)
    assert out.data_ptr() not in (x.data_ptr(), w.data_ptr())


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("shape", [(1, 4096), (9, 300), (2, 3, 128)])
def test_fused_add_rmsnorm_returns_output_and_residual_in_that_order(dtype, shape):
    x, r = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[-1], dtype=dtype)
    out, res = run(b.build_fused_add_rms_norm, x, r, w, eps=1e-6)
    summed = x + r
    assert torch.equal(res, summed)
    close(out, rms_ref(summed, w, 1e-6))
    assert res.data_ptr() not in (x.data_ptr(), r.data_ptr())


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 4096), (5, 333), (16, 16)])
def test_layernorm_matches_torch(dtype, shape):
    x = torch.randn(shape, dtype=dtype) * 3 + 1
    w, bias = torch.randn(shape[-1], dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    out = run(b.build_layer_norm, x, w, bias, normalized_shape=(shape[-1],), eps=1e-5)
    close(out, F.layer_norm(x.float(), (shape[-1],), w.float(), bias.float(), 1e-5).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape,groups", [((2, 8, 5, 7), 4), ((1, 6, 3), 3), ((3, 4, 33), 1)])
def test_groupnorm_matches_torch_with_and_without_affine(dtype, affine, shape, groups):
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[1], dtype=dtype) if affine else None
    bias = torch.randn(shape[1], dtype=dtype) if affine else None
    out = run(b.build_group_norm, x, w, bias, num_groups=groups, eps=1e-5)
    ref = F.group_norm(
        x.float(), groups, None if w is None else w.float(), None if bias is None else bias.float(), 1e-5
    )
    close(out, ref.to(dtype))


def test_groupnorm_rejects_channels_that_do_not_split_into_groups():
    x = torch.randn(2, 6, 4)
    with pytest.raises(ValueError, match="C=6, num_groups=4"):
        b.build_group_norm(spec(x), None, None, num_groups=4, eps=1e-5)


def test_a_new_row_count_reuses_the_specialisation_without_a_new_build():
    w = torch.randn(512, dtype=torch.bfloat16)
    before = b.specialisations.builds
    kernels = {
        id(
            b.build_rms_norm(
                spec(torch.empty(rows, 512, dtype=torch.bfloat16)), spec(w), normalized_shape=(512,), eps=1e-6
            )
        )
        for rows in (1, 2, 3, 17, 1000)
    }
    assert len(kernels) == 1
    assert b.specialisations.builds - before <= 1


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 4096), (7, 257), (3, 5, 100), (2, 1)])
def test_fused_add_layer_norm_returns_output_and_residual_in_that_order(dtype, shape):
    x, r = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    w, bias = torch.randn(shape[-1], dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    out, res = run(b.build_fused_add_layer_norm, x, r, w, bias, eps=1e-5)
    summed = x + r
    assert torch.equal(res, summed)
    close(out, F.layer_norm(summed.float(), (shape[-1],), w.float(), bias.float(), 1e-5).to(dtype))


def test_fused_add_layer_norm_refuses_a_bias_of_the_wrong_size():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        b.build_fused_add_layer_norm(spec(x), spec(x), spec(x[0]), spec(torch.randn(7)), eps=1e-5)
