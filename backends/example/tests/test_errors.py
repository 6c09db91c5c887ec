"""The design page's four error messages, character for character, each from the
situation it names. None of them falls back to another implementation."""

from __future__ import annotations

import pytest
import tileops_cpu
import torch

from tileops.backend import (
    BUILTIN,
    BackendError,
    OpNotAvailableError,
    UnknownTargetError,
)
from tileops.ops import GemmFwdOp, RMSNormFwdOp, SoftmaxFwdOp


def _half(*shape):
    return torch.randn(*shape).to(torch.float16)


class GemmOp(GemmFwdOp):
    """Test-only: GemmFwdOp with a fetch site that hands over no tensors.

    Its class name is not a manifest entry, so it keeps GemmFwdOp's; and it is the name
    tileops_cpu.pending registered a builder under, so the builder lookup succeeds and
    the missing tensors are what is reported.
    """

    def _fetch(self, a, b):
        m, k = a.shape
        return self.get_or_build_kernel("gemm_kernel", None, key=("gemm", m, k, a.dtype), build=lambda: None)


def test_an_op_the_target_has_no_builder_for_raises_and_never_falls_back():
    with pytest.raises(OpNotAvailableError) as caught:
        SoftmaxFwdOp(dim=-1)(_half(4, 8))
    assert str(caught.value) == (
        "target 'torch_cpu' registers no kernel builder for SoftmaxFwdOp; targets that do: []. "
        "There is no fall back to the in-tree implementation: those kernels do not run on this "
        "target's devices."
    )


def test_an_unknown_target_is_refused_at_the_first_call_naming_the_known_ones():
    op = RMSNormFwdOp(normalized_shape=(8,), target="nope")  # the first call settles it (C4)
    with pytest.raises(UnknownTargetError) as caught:
        op(_half(4, 8), _half(8))
    assert str(caught.value) == "no backend registered target 'nope'; known targets: ['torch_cpu']"


def test_builtin_on_cpu_reaches_the_in_tree_kernel_which_refuses_cpu_tensors(monkeypatch):
    # The page's second premise test (C9): forcing the in-tree kernels on CPU tensors must
    # reach the kernel's own refusal, not a failed CUDA query on the way there.
    def forbidden(*args, **kwargs):
        raise AssertionError("the op layer asked CUDA something before reaching the kernel")

    for name in ("is_available", "device_count", "current_device", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    monkeypatch.setattr(tileops_cpu, "CpuRMSNorm", forbidden)  # BUILTIN bypasses the backend
    op = RMSNormFwdOp(normalized_shape=(8,), target=BUILTIN)
    with pytest.raises(ValueError) as caught:
        op(_half(2, 8), _half(8))
    assert str(caught.value) == (
        "RMSNormKernel is a CUDA kernel; got x on cpu and weight on cpu. Another target's backend serves other devices."
    )


def test_a_fetch_site_that_hands_over_no_tensors_is_not_wired():
    with pytest.raises(OpNotAvailableError) as caught:
        GemmOp()(_half(4, 8), _half(3, 8))
    assert str(caught.value) == (
        "target 'torch_cpu' serves GemmOp, but its 'gemm_kernel' call site does not hand over "
        "the tensors a builder is described with; that op is not wired to external targets yet"
    )


def test_a_kernel_construction_error_propagates_with_a_note_naming_the_target_and_op(monkeypatch):
    def refuse(normalized_shape, eps, dtype):
        raise ValueError(f"torch_cpu RMSNorm: no kernel for hidden size {normalized_shape}")

    monkeypatch.setattr(tileops_cpu, "CpuRMSNorm", refuse)
    op = RMSNormFwdOp(normalized_shape=(8,))
    with pytest.raises(ValueError, match=r"no kernel for hidden size \(8,\)") as caught:
        op(_half(2, 8), _half(8))
    assert "raised by the kernel builder of target 'torch_cpu' for RMSNormFwdOp" in getattr(
        caught.value, "__notes__", []
    )
    assert op.settled_target is None  # a failed first call settles nothing


def test_an_instance_settled_on_cpu_refuses_a_device_its_target_does_not_claim():
    op = RMSNormFwdOp(normalized_shape=(8,))
    op(_half(2, 8), _half(8))
    meta = torch.empty(2, 8, dtype=torch.float16, device="meta")
    with pytest.raises(BackendError, match="torch_cpu") as caught:
        op(meta, meta[0])
    assert "meta" in str(caught.value)


@pytest.mark.requires_cuda_runtime
def test_builtin_on_a_cuda_device_reaches_the_in_tree_kernel():
    x = torch.randn(2, 8, dtype=torch.float16, device="cuda")
    op = RMSNormFwdOp(normalized_shape=(8,), target=BUILTIN)
    with pytest.raises(OpNotAvailableError, match="built without in-tree CUDA kernels"):
        op(x, x[0])
