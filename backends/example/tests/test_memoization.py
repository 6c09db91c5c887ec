"""When the op layer calls this backend's build_kernel again, and when it does not: once
per device and input signature, per op instance; a new shape or dtype builds again, params
are not in the key, and a build that raised is asked again.

The memo itself (its bound, what it evicts, its counters, concurrent first calls) is
tileops' machinery and tested in tileops' own suites. What a backend needs from it: the
kernels it returns may be dropped at any time, so a kernel holds what it needs itself and
the builder must be fine being asked again for a signature it built before.
"""

from __future__ import annotations

import pytest
import tileops_cpu
import torch
from tileops_cpu.kernels import CpuGemm, CpuGemv, CpuRMSNorm

from tileops.ops import GemmFwdOp, RMSNormFwdOp

CPU = torch.device("cpu")


def _randn(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


@pytest.fixture
def constructed(monkeypatch):
    """Every CpuRMSNorm the builder constructs, in order (one per builder call)."""
    made = []

    class Counting(CpuRMSNorm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(tileops_cpu, "CpuRMSNorm", Counting)
    return made


def test_the_same_device_and_signature_reuse_the_kernel_without_calling_the_builder(constructed):
    op = RMSNormFwdOp(normalized_shape=(64,))
    for _ in range(3):
        op(_randn(4, 64), _randn(64))  # new tensors, same signature
    assert len(constructed) == 1


def test_a_new_shape_builds_again(constructed):
    op = RMSNormFwdOp(normalized_shape=(64,))
    op(_randn(4, 64), _randn(64))
    op(_randn(5, 64), _randn(64))
    op(_randn(4, 64), _randn(64))
    assert len(constructed) == 2
    assert op.kernel_cache_stats()["builds"] == 2


def test_a_new_dtype_builds_again(constructed):
    op = RMSNormFwdOp(normalized_shape=(64,))
    op(_randn(4, 64), _randn(64))
    op(_randn(4, 64, dtype=torch.bfloat16), _randn(64, dtype=torch.bfloat16))
    assert [k.dtype for k in constructed] == [torch.float16, torch.bfloat16]


def test_the_memo_key_is_the_device_then_dtype_and_shape_per_input():
    op = RMSNormFwdOp(normalized_shape=(64,))
    op(_randn(4, 64), _randn(64))
    op(_randn(2, 3, 64, dtype=torch.bfloat16), _randn(64, dtype=torch.bfloat16))
    keys = set(op.built_kernels("rms_norm"))
    assert keys == {
        (CPU, (torch.float16, (4, 64)), (torch.float16, (64,))),
        (CPU, (torch.bfloat16, (2, 3, 64)), (torch.bfloat16, (64,))),
    }
    for key in keys:
        assert isinstance(key[0], torch.device)


def test_the_memo_holds_exactly_what_the_builder_returned():
    op = RMSNormFwdOp(normalized_shape=(64,), eps=1e-5)
    op(_randn(4, 64), _randn(64))
    (kernel,) = op.built_kernels("rms_norm").values()
    assert type(kernel) is CpuRMSNorm and kernel.eps == 1e-5


def test_each_op_instance_has_its_own_memo(constructed):
    first = RMSNormFwdOp(normalized_shape=(64,))
    second = RMSNormFwdOp(normalized_shape=(64,))
    first(_randn(4, 64), _randn(64))
    second(_randn(4, 64), _randn(64))
    assert len(constructed) == 2
    assert list(first.built_kernels("rms_norm").values()) == [constructed[0]]
    assert list(second.built_kernels("rms_norm").values()) == [constructed[1]]


def test_params_are_not_in_the_key_because_they_are_fixed_per_instance(constructed):
    loose = RMSNormFwdOp(normalized_shape=(64,), eps=1e-2)
    tight = RMSNormFwdOp(normalized_shape=(64,), eps=1e-6)
    x, weight = _randn(4, 64), _randn(64)
    loose(x, weight)
    tight(x, weight)
    assert [k.eps for k in constructed] == [1e-2, 1e-6]
    assert set(loose.built_kernels("rms_norm")) == set(tight.built_kernels("rms_norm"))


def test_gemm_and_gemv_signatures_are_memoized_separately():
    op = GemmFwdOp()
    b = _randn(8, 16)
    for _ in range(2):
        op(_randn(1, 16), b)
        op(_randn(4, 16), b)
    kernels = [*op.built_kernels("gemm_kernel").values(), *op.built_kernels("gemv_kernel").values()]
    assert sorted(type(k).__name__ for k in kernels) == ["CpuGemm", "CpuGemv"]
    assert all(isinstance(k, (CpuGemm, CpuGemv)) for k in kernels)
    assert op.kernel_cache_stats()["builds"] == 2


def test_a_builder_that_raised_is_asked_again_on_the_next_call(monkeypatch):
    attempts = []

    def flaky(normalized_shape, eps, dtype):
        attempts.append(dtype)
        if len(attempts) == 1:
            raise RuntimeError("compilation failed: out of compiler licences")
        return CpuRMSNorm(normalized_shape, eps, dtype)

    monkeypatch.setattr(tileops_cpu, "CpuRMSNorm", flaky)
    op = RMSNormFwdOp(normalized_shape=(64,))
    with pytest.raises(RuntimeError, match="compilation failed"):
        op(_randn(4, 64), _randn(64))
    assert dict(op.built_kernels("rms_norm")) == {}
    op(_randn(4, 64), _randn(64))
    assert len(attempts) == 2 and len(op.built_kernels("rms_norm")) == 1
