"""With the backend installed, CPU calls of RMSNormFwdOp and GemmFwdOp run its kernels:
same numbers as PyTorch, the manifest's checks in front, fresh outputs behind."""

from __future__ import annotations

import pytest
import tileops_cpu
import torch
import torch.nn.functional as F
from tileops_cpu.kernels import CpuGemm, CpuGemv, CpuRMSNorm

from tileops.ops import GemmFwdOp, RMSNormFwdOp

HALF_DTYPES = [torch.float16, torch.bfloat16]


def _randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def _kernels(op, *roles):
    """Every kernel an instance memoized, over the given roles."""
    return [k for role in roles for k in op.built_kernels(role).values()]


class _Unreachable:
    """Stands in for a kernel class when a test promises the builder is never reached."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("the builder was reached")


# ---- RMSNormFwdOp -------------------------------------------------------------------


def test_the_design_page_command_returns_normally_once_installed():
    x = _randn(4, 64)
    weight = _randn(64)
    y = RMSNormFwdOp(normalized_shape=(64,))(x, weight)
    assert torch.equal(y, F.rms_norm(x, (64,), weight, eps=1e-6))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize(
    "x_shape, normalized_shape",
    [
        ((4, 64), (64,)),
        ((1, 4096), (4096,)),
        ((3, 5, 96), (96,)),
        ((2, 3, 7, 33), (7, 33)),
        ((17,), (17,)),
        ((0, 8), (8,)),
    ],
    ids=str,
)
@pytest.mark.parametrize("eps", [None, 1e-6, 1e-3, 0.25], ids=lambda e: f"eps={e}")
def test_rms_norm_equals_torch_rms_norm_bit_for_bit(dtype, x_shape, normalized_shape, eps):
    x = _randn(*x_shape, dtype=dtype)
    weight = _randn(*normalized_shape, dtype=dtype)
    if eps is None:
        op = RMSNormFwdOp(normalized_shape)  # the manifest default: 1e-6
    else:
        op = RMSNormFwdOp(normalized_shape, eps=eps)
    expected = F.rms_norm(x, normalized_shape, weight, eps=1e-6 if eps is None else eps)
    y = op(x, weight)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, expected)


def test_the_default_eps_reaches_the_kernel_as_the_manifest_value_1e_6():
    op = RMSNormFwdOp(normalized_shape=(64,))
    op(_randn(2, 64), _randn(64))
    (kernel,) = _kernels(op, "rms_norm")
    assert isinstance(kernel, CpuRMSNorm)
    assert (kernel.normalized_shape, kernel.eps, kernel.dtype) == ((64,), 1e-6, torch.float16)


def test_non_contiguous_inputs_reach_the_kernel_contiguous_and_give_the_same_result(monkeypatch):
    seen = []

    class Recording(CpuRMSNorm):
        def __call__(self, x, weight):
            seen.append((x.is_contiguous(), weight.is_contiguous()))
            return super().__call__(x, weight)

    monkeypatch.setattr(tileops_cpu, "CpuRMSNorm", Recording)
    x = _randn(64, 6).t()  # [6, 64], strided
    weight = _randn(64, 2)[:, 0]  # every other element
    assert not x.is_contiguous() and not weight.is_contiguous()
    y = RMSNormFwdOp(normalized_shape=(64,))(x, weight)
    assert seen == [(True, True)]
    assert torch.equal(y, F.rms_norm(x.contiguous(), (64,), weight.contiguous(), eps=1e-6))


@pytest.mark.parametrize(
    "x, weight, says",
    [
        (torch.randn(4, 64), torch.randn(64), "dtype"),  # float32: not in the manifest
        (_randn(4, 64), _randn(64, dtype=torch.bfloat16), "same dtype"),
        (_randn(4, 32), _randn(64), "shape rule"),
        (_randn(4, 64), _randn(32), "shape rule"),
    ],
    ids=["float32-x", "mixed-dtypes", "x-wrong-hidden-size", "weight-wrong-size"],
)
def test_a_call_the_manifest_rejects_never_reaches_the_builder(monkeypatch, x, weight, says):
    monkeypatch.setattr(tileops_cpu, "CpuRMSNorm", _Unreachable)
    op = RMSNormFwdOp(normalized_shape=(64,))
    with pytest.raises(ValueError, match=says):
        op(x, weight)
    assert op.kernel_cache_stats()["builds"] == 0
    assert dict(op.built_kernels("rms_norm")) == {}
    assert op.settled_target is None


def test_outputs_never_alias_inputs():
    x, weight = _randn(4, 64), _randn(64)
    x_before, weight_before = x.clone(), weight.clone()
    y = RMSNormFwdOp(normalized_shape=(64,))(x, weight)
    for tensor in (x, weight):
        assert y.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
    y.fill_(0)
    assert torch.equal(x, x_before) and torch.equal(weight, weight_before)

    a, b = _randn(8, 16), _randn(4, 16)
    d = GemmFwdOp()(a, b)
    assert all(d.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in (a, b))


# ---- GemmFwdOp ----------------------------------------------------------------------


def _gemm_operands(m, n, k, trans_a, trans_b, dtype):
    a = _randn(k, m, dtype=dtype) if trans_a else _randn(m, k, dtype=dtype)
    b = _randn(n, k, dtype=dtype) if trans_b else _randn(k, n, dtype=dtype)
    return a, b


def _reference(a, b, trans_a, trans_b):
    lhs = (a.t() if trans_a else a).float()
    rhs = (b.t() if trans_b else b).float()
    return lhs @ rhs


LAYOUTS = {"NT": (False, True), "NN": (False, False), "TN": (True, False), "TT": (True, True)}


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gemm_matches_matmul_for_every_layout(layout, dtype):
    trans_a, trans_b = LAYOUTS[layout]
    a, b = _gemm_operands(24, 40, 32, trans_a, trans_b, dtype)
    op = GemmFwdOp(trans_a=trans_a, trans_b=trans_b)
    d = op(a, b)
    assert d.dtype == dtype and d.shape == (24, 40)
    torch.testing.assert_close(d.float(), _reference(a, b, trans_a, trans_b), rtol=2e-2, atol=2e-1)
    assert [type(k) for k in _kernels(op, "gemm_kernel", "gemv_kernel")] == [CpuGemm]


@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
def test_a_single_row_gemm_takes_the_gemv_kernel(layout):
    trans_a, trans_b = LAYOUTS[layout]
    a, b = _gemm_operands(1, 40, 32, trans_a, trans_b, torch.float16)
    op = GemmFwdOp(trans_a=trans_a, trans_b=trans_b)
    d = op(a, b)
    assert d.shape == (1, 40)
    torch.testing.assert_close(d.float(), _reference(a, b, trans_a, trans_b), rtol=2e-2, atol=2e-1)
    (kernel,) = _kernels(op, "gemm_kernel", "gemv_kernel")
    assert isinstance(kernel, CpuGemv) and kernel.side == "lhs_row"
    assert (kernel.trans_a, kernel.trans_b) == (trans_a, trans_b)


def test_a_single_column_gemm_takes_the_gemv_kernel():
    a, b = _gemm_operands(24, 1, 32, False, False, torch.bfloat16)
    op = GemmFwdOp(trans_b=False)
    d = op(a, b)
    assert d.shape == (24, 1)
    torch.testing.assert_close(d.float(), _reference(a, b, False, False), rtol=2e-2, atol=2e-1)
    (kernel,) = _kernels(op, "gemm_kernel", "gemv_kernel")
    assert isinstance(kernel, CpuGemv) and kernel.side == "rhs_col"


def test_a_gemm_with_mismatched_k_never_reaches_the_builder(monkeypatch):
    monkeypatch.setattr(tileops_cpu, "CpuGemm", _Unreachable)
    with pytest.raises(ValueError, match="shape rule"):
        GemmFwdOp()(_randn(8, 16), _randn(4, 32))


def _forbid_cuda_queries(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the op layer asked CUDA something before a target was chosen")

    for name in (
        "is_available",
        "device_count",
        "current_device",
        "get_device_capability",
        "get_device_properties",
        "current_stream",
        "init",
    ):
        monkeypatch.setattr(torch.cuda, name, forbidden)


def test_a_gemm_call_on_cpu_reaches_the_backend_without_asking_cuda_anything(monkeypatch):
    # One of the page's two premise tests (requirement C9). The reference op layer asked
    # CUDA for its SM version before choosing a target, so this needed a GPU there; here
    # nothing hardware-specific is queried first, and it runs everywhere.
    _forbid_cuda_queries(monkeypatch)
    a, b = _randn(8, 16), _randn(4, 16)
    op = GemmFwdOp()
    d = op(a, b)
    assert op.settled_target == "torch_cpu"
    torch.testing.assert_close(d.float(), _reference(a, b, False, True), rtol=2e-2, atol=2e-1)
