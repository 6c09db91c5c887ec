"""tileops-backend-example: target ``torch_cpu``, every CPU device, kernels in PyTorch.

All registration happens here, at import. tileops imports this module through the
entry point in ``pyproject.toml`` when the first op is constructed; nobody imports it
by hand. Importing it compiles nothing: kernels are built when an op asks for one.
"""

from __future__ import annotations

import torch

from tileops.backend import TensorSpec, register_detector, register_kernel_builder

from .kernels import CpuGemm, CpuGemv, CpuRMSNorm
from .pending import build_gemm_pending

TARGET = "torch_cpu"


def _detect(device: torch.device) -> bool:
    """One predicate over the device: every CPU belongs to this target."""
    return device.type == "cpu"


def build_rms_norm(x: TensorSpec, weight: TensorSpec, *, normalized_shape, eps):
    """RMSNormFwdOp. ``eps`` arrives resolved (1e-6 when the caller left it out)."""
    return CpuRMSNorm(normalized_shape, eps, x.dtype)


def build_gemm(a: TensorSpec, b: TensorSpec, *, trans_a, trans_b):
    """GemmFwdOp. The op's own split into gemm/gemv roles is not handed over: the
    builder reads M and N off the specs and picks a kernel itself."""
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    if m == 1:
        return CpuGemv("lhs_row", trans_a, trans_b, a.dtype)
    if n == 1:
        return CpuGemv("rhs_col", trans_a, trans_b, a.dtype)
    return CpuGemm(trans_a, trans_b, a.dtype)


register_detector(target=TARGET, detect=_detect)
register_kernel_builder(op="RMSNormFwdOp", target=TARGET, build_kernel=build_rms_norm)
register_kernel_builder(op="GemmFwdOp", target=TARGET, build_kernel=build_gemm)
# Registered under a name no manifest declares: never called (see pending.py).
register_kernel_builder(op="GemmOp", target=TARGET, build_kernel=build_gemm_pending)
