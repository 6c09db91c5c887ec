"""The op layer's contract, the same for every target (E1-E6, E9)."""

from __future__ import annotations

import inspect

import pytest
import torch

from tileops import manifest
from tileops.ops import (
    ALL_OPS,
    AddFwdOp,
    ClampFwdOp,
    GemmFwdOp,
    GroupNormFwdOp,
    RMSNormFwdOp,
    SiluFwdOp,
    SoftmaxFwdOp,
)


def half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16)


@pytest.mark.parametrize("cls", ALL_OPS, ids=lambda c: c.__name__)
def test_every_op_takes_its_manifest_params_and_target_kernel_map_tune_keywords(cls):
    entry = manifest.entry(cls.__name__)
    params = inspect.signature(cls.__init__).parameters
    for decl in entry.params:
        assert decl.name in params
        if decl.kw_only:
            assert params[decl.name].kind is inspect.Parameter.KEYWORD_ONLY
        if not decl.required:
            assert params[decl.name].default == decl.default
    for keyword in ("target", "kernel_map", "tune"):
        assert params[keyword].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("cls", ALL_OPS, ids=lambda c: c.__name__)
def test_every_op_forward_takes_its_manifest_inputs_in_order(cls):
    entry = manifest.entry(cls.__name__)
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    unused = list(entry.upstream.forward) if entry.upstream else []  # upstream's, after the inputs
    assert [p.name for p in params] == [*(i.name for i in entry.inputs), *unused]
    for i, (p, decl) in enumerate(zip(params, entry.inputs)):
        trailing = all(d.optional for d in entry.inputs[i:])  # no required input follows
        assert (p.default is None) == (decl.optional and trailing)


def test_rmsnorm_is_importable_from_its_family_module():
    from tileops.ops.norm.rms_norm import RMSNormFwdOp as direct

    assert direct is RMSNormFwdOp


def test_a_bad_param_is_rejected_at_construction():
    with pytest.raises(TypeError, match="eps"):
        RMSNormFwdOp(normalized_shape=(4,), eps="small")
    with pytest.raises(TypeError):
        RMSNormFwdOp()  # normalized_shape is required


def test_an_unknown_kernel_map_role_is_rejected():
    with pytest.raises(ValueError, match="kernel_map role 'fast'"):
        RMSNormFwdOp(normalized_shape=(4,), kernel_map={"fast": object})


def test_a_wrong_dtype_never_reaches_the_builder(cpu_target):
    with pytest.raises(ValueError, match=r"input 'x' expects dtype float16 \| bfloat16, got torch.float32"):
        RMSNormFwdOp(normalized_shape=(8,))(torch.randn(2, 8), torch.randn(8))
    assert cpu_target.builds == [] and cpu_target.calls == []


def test_a_wrong_shape_never_reaches_the_builder(cpu_target):
    with pytest.raises(ValueError, match="weight"):
        RMSNormFwdOp(normalized_shape=(8,))(half(2, 8), half(4))
    assert cpu_target.builds == []


def test_a_non_tensor_input_is_a_type_error_naming_it(cpu_target):
    with pytest.raises(TypeError, match=r"input 'weight' expects a tensor, got float: 1.0"):
        RMSNormFwdOp(normalized_shape=(8,))(half(2, 8), 1.0)
    with pytest.raises(TypeError, match="input 'x'"):
        RMSNormFwdOp(normalized_shape=(8,))([1, 2], half(8))


def test_inputs_on_two_devices_are_rejected(cpu_target, meta_target):
    with pytest.raises(ValueError, match="one device"):
        RMSNormFwdOp(normalized_shape=(8,))(half(2, 8), torch.empty(8, dtype=torch.float16, device="meta"))
    assert cpu_target.builds == [] and meta_target.builds == []


def test_params_reach_the_builder_normalised(cpu_target):
    SoftmaxFwdOp()(torch.randn(2, 3, 4))  # dim=None on 3-d input: PyTorch's legacy dim 0
    ((_, params),) = cpu_target.builds_of("SoftmaxFwdOp")
    assert params == {"dim": 0}


def test_kernels_receive_contiguous_tensors_and_the_result_is_right(cpu_target):
    x = torch.randn(8, 4, dtype=torch.float16).t()  # non-contiguous view
    w = half(8)
    out = RMSNormFwdOp(normalized_shape=(8,))(x, w)
    assert cpu_target.calls[-1].contiguous == (True, True)
    assert torch.equal(out, torch.nn.functional.rms_norm(x.contiguous(), (8,), w, 1e-6))
    RMSNormFwdOp(normalized_shape=(8,))(x, w)  # and on a memo hit
    assert cpu_target.calls[-1].contiguous == (True, True)


def test_a_strided_input_written_in_place_gets_its_values_back(cpu_target):
    base = torch.randn(6, 4)
    x = base.t()  # non-contiguous: the kernel works on a copy
    expected = torch.nn.functional.silu(x)
    op = SiluFwdOp(inplace=True)
    out = op(x)
    assert out is x
    assert torch.allclose(x, expected)
    y = torch.randn(6, 4).t()  # the memo-hit path writes back too
    expected_y = torch.nn.functional.silu(y)
    assert op(y) is y and torch.allclose(y, expected_y)


def test_outputs_keep_the_manifest_shapes_and_dtypes(cpu_target):
    d = GemmFwdOp(trans_a=False, trans_b=False)(half(3, 5), half(5, 7))
    assert d.shape == (3, 7) and d.dtype == torch.float16
    out = AddFwdOp()(torch.randn(4, 1, 3), torch.randn(5, 1))
    assert out.shape == (4, 5, 3)


def test_a_functional_output_never_aliases_an_input(cpu_target):
    x = torch.randn(5, 5)
    out = SiluFwdOp()(x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_optional_inputs_may_be_passed_by_keyword(cpu_target):
    x = torch.randn(2, 4, 3)
    lo = torch.zeros(2, 4, 3)
    out = ClampFwdOp()(x, min=lo)
    assert torch.equal(out, torch.clamp(x, min=lo))
    y = GroupNormFwdOp(num_groups=2)(x, weight=torch.ones(4), bias=torch.zeros(4))
    assert torch.allclose(y, torch.nn.functional.group_norm(x, 2, torch.ones(4), torch.zeros(4)))


def test_a_call_with_no_tensor_decides_nothing(cpu_target):
    op = ClampFwdOp()
    with pytest.raises(TypeError):
        op(None)
    assert op.settled_target is None


def test_roofline_comes_from_the_manifest():
    op = RMSNormFwdOp(normalized_shape=(4096,))
    flops, nbytes = op.roofline(half(2048, 4096), half(4096))
    assert flops == 4 * 2048 * 4096
    assert nbytes == (2 * 2048 * 4096 + 4096) * 2
