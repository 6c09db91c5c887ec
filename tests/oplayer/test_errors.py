"""What the op layer says when a call cannot be served (C7, C9, D6-D8, G1, G2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from tileops.backend import (
    BUILTIN,
    BackendError,
    OpNotAvailableError,
    register_detector,
    register_kernel_builder,
)
from tileops.ops import GemmFwdOp, RMSNormFwdOp, SoftmaxFwdOp


def half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16)


def test_a_target_without_a_builder_for_the_op_does_not_fall_back():
    register_detector("torch_cpu", lambda d: d.type == "cpu")
    with pytest.raises(OpNotAvailableError) as info:
        SoftmaxFwdOp(dim=-1)(torch.randn(2, 3))
    assert str(info.value) == (
        "target 'torch_cpu' registers no kernel builder for SoftmaxFwdOp; targets that do: []. "
        "There is no fall back to the in-tree implementation: those kernels do not run on this "
        "target's devices."
    )


def test_the_no_builder_error_lists_the_targets_that_do_have_one():
    register_detector("torch_cpu", lambda d: d.type == "cpu")
    register_kernel_builder("SoftmaxFwdOp", "other", lambda x, *, dim: None)
    with pytest.raises(OpNotAvailableError, match=r"targets that do: \['other'\]"):
        SoftmaxFwdOp(dim=-1)(torch.randn(2, 3))


class GemmOp(GemmFwdOp):
    """A fetch site that hands over no tensors: not wired to external targets."""

    def _fetch(self, a, b):
        return self.get_or_build_kernel("gemm_kernel", None, key=("gemm",), build=lambda: None)


def test_a_fetch_site_without_tensors_is_reported_as_not_wired():
    register_detector("torch_cpu", lambda d: d.type == "cpu")
    register_kernel_builder("GemmOp", "torch_cpu", lambda a, b, *, trans_a, trans_b: None)
    with pytest.raises(OpNotAvailableError) as info:
        GemmOp()(half(4, 8), half(4, 8))
    assert str(info.value) == (
        "target 'torch_cpu' serves GemmOp, but its 'gemm_kernel' call site does not hand over "
        "the tensors a builder is described with; that op is not wired to external targets yet"
    )


def test_the_builder_lookup_comes_before_the_wiring_check():
    register_detector("torch_cpu", lambda d: d.type == "cpu")
    with pytest.raises(OpNotAvailableError, match="registers no kernel builder for GemmOp"):
        GemmOp()(half(4, 8), half(4, 8))


class SoftmaxWithoutInTree(SoftmaxFwdOp):
    def _fetch(self, x):
        return self.get_or_build_kernel("softmax_fwd", (x,))


def test_an_op_without_an_in_tree_kernel_and_no_target_says_it_needs_one():
    register_kernel_builder("SoftmaxWithoutInTree", "somewhere", lambda x, *, dim: None)
    with pytest.raises(OpNotAvailableError) as info:
        SoftmaxWithoutInTree(dim=-1)(torch.randn(2, 3))
    text = str(info.value)
    assert "needs a target" in text and "['somewhere']" in text


def test_builtin_on_cpu_raises_the_in_tree_kernels_device_error():
    with pytest.raises(ValueError) as info:
        RMSNormFwdOp(normalized_shape=(64,), target=BUILTIN)(half(4, 64), half(64))
    assert str(info.value) == "RMSNormKernel is a CUDA kernel; got x on cpu and weight on cpu."


def test_builtin_on_a_device_another_target_claims_says_so():
    register_detector("torch_cpu", lambda d: d.type == "cpu")
    with pytest.raises(ValueError) as info:
        RMSNormFwdOp(normalized_shape=(64,), target=BUILTIN)(half(4, 64), half(64))
    assert str(info.value) == (
        "RMSNormKernel is a CUDA kernel; got x on cpu and weight on cpu. Another target's backend serves other devices."
    )


def test_no_claimant_means_the_in_tree_kernels_without_asking_cuda():
    with pytest.raises(ValueError, match="is a CUDA kernel"):
        GemmFwdOp()(half(4, 8), half(4, 8))


def test_a_kernel_returning_the_wrong_shape_is_a_backend_error_and_is_not_kept():
    register_detector("sloppy", lambda d: d.type == "cpu")
    register_kernel_builder("SoftmaxFwdOp", "sloppy", lambda x, *, dim: lambda x: x[:1].clone())
    op = SoftmaxFwdOp(dim=-1)
    for _ in range(2):
        with pytest.raises(BackendError, match=r"returned output 'output' as torch.float32 \(1, 3\)"):
            op(torch.randn(2, 3))
    assert op.kernel_cache_stats()["size"] == 0


def test_no_call_reaches_cuda_before_a_target_is_chosen(tmp_path):
    """C9, in a fresh interpreter: every tileops entry point used on CPU leaves CUDA cold."""
    script = textwrap.dedent(
        """
        import torch
        calls = []
        for name in ("is_available", "device_count", "get_device_capability", "current_device",
                     "get_device_properties", "_lazy_init"):
            original = getattr(torch.cuda, name)
            def spy(*a, _name=name, _original=original, **k):
                calls.append(_name)
                return _original(*a, **k)
            setattr(torch.cuda, name, spy)
        import tileops
        from tileops.backend import BUILTIN, register_detector, register_kernel_builder
        from tileops.ops import GemmFwdOp, RMSNormFwdOp
        register_detector("cpu_only", lambda d: d.type == "cpu")
        register_kernel_builder("GemmFwdOp", "cpu_only",
                                lambda a, b, *, trans_a, trans_b: lambda a, b: a @ b.T)
        a = torch.randn(4, 8, dtype=torch.float16)
        GemmFwdOp()(a, a)
        try:
            RMSNormFwdOp((8,), target=BUILTIN)(a, a[0])
        except ValueError:
            pass
        assert calls == [], calls
        assert not torch.cuda.is_initialized()
        print("cold")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cold"
