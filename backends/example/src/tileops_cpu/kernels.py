"""The kernels of target ``torch_cpu``, in plain PyTorch.

A kernel is an object built once per device and input signature and then called many
times. Its constructor takes compile-time values only: the things a real backend would
bake into generated code (dtype, a hidden size, a layout). Everything that changes from
call to call — the row count of an RMSNorm, M of a GEMM — is read from the tensors in
``__call__``. ``CpuRMSNorm`` therefore never sees a row count: on a decode path the
batch grows step by step, and a constructor that took it would rebuild at every step.

On real hardware this is the file to replace: compile in ``__init__``, launch on the
current stream in ``__call__``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


class CpuRMSNorm:
    """y = rms_norm(x over the last ``len(normalized_shape)`` dims) * weight.

    Computed by ``torch.nn.functional.rms_norm`` itself, so the result equals it bit for
    bit on the CPU for every dtype and shape it accepts.
    """

    def __init__(self, normalized_shape: Sequence[int], eps: float, dtype: torch.dtype) -> None:
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = float(eps)
        self.dtype = dtype

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)

    def __repr__(self) -> str:
        return (
            f"CpuRMSNorm(normalized_shape={self.normalized_shape}, eps={self.eps}, "
            f"dtype={self.dtype})"
        )


def _operands(
    a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """op(a) [M, K] and op(b) [K, N] as views: a transpose costs no copy."""
    return (a.t() if trans_a else a), (b.t() if trans_b else b)


class CpuGemm:
    """d = op(a) @ op(b), the general case."""

    def __init__(self, trans_a: bool, trans_b: bool, dtype: torch.dtype) -> None:
        self.trans_a = trans_a
        self.trans_b = trans_b
        self.dtype = dtype

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        lhs, rhs = _operands(a, b, self.trans_a, self.trans_b)
        return torch.matmul(lhs, rhs)

    def __repr__(self) -> str:
        return f"CpuGemm(trans_a={self.trans_a}, trans_b={self.trans_b}, dtype={self.dtype})"


class CpuGemv:
    """d = op(a) @ op(b) when one side is a single vector: ``"lhs_row"`` (M == 1) or
    ``"rhs_col"`` (N == 1). A matrix-vector product, no GEMM tiling."""

    SIDES = ("lhs_row", "rhs_col")

    def __init__(self, side: str, trans_a: bool, trans_b: bool, dtype: torch.dtype) -> None:
        if side not in self.SIDES:
            raise ValueError(f"CpuGemv side must be one of {self.SIDES}, got {side!r}")
        self.side = side
        self.trans_a = trans_a
        self.trans_b = trans_b
        self.dtype = dtype

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        lhs, rhs = _operands(a, b, self.trans_a, self.trans_b)
        if self.side == "lhs_row":  # [1, K] @ [K, N] -> [1, N]
            return torch.mv(rhs.t(), lhs[0]).unsqueeze(0)
        return torch.mv(lhs, rhs[:, 0]).unsqueeze(1)  # [M, K] @ [K, 1] -> [M, 1]

    def __repr__(self) -> str:
        return (
            f"CpuGemv(side={self.side!r}, trans_a={self.trans_a}, trans_b={self.trans_b}, "
            f"dtype={self.dtype})"
        )
