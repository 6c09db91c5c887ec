"""Norms: RMSNormFwdOp and FusedAddRMSNormFwdOp."""

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

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)

    def __repr__(self) -> str:
        return (
            f"CpuRMSNorm(normalized_shape={self.normalized_shape}, eps={self.eps}, "
            f"dtype={self.dtype})"
        )


class CpuFusedAddRMSNorm:
    """r = x + residual; returns (rms_norm(r over the last dim) * weight, r).

    The sum is rounded to the dtype before it is normalised: it is also the residual the
    next layer adds to, and a transformer's own residual add rounds it there too.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        self.hidden_size = int(hidden_size)
        self.eps = float(eps)
        self.dtype = dtype

    @torch.no_grad()
    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + residual
        return F.rms_norm(total, (self.hidden_size,), weight, self.eps), total

    def __repr__(self) -> str:
        return (
            f"CpuFusedAddRMSNorm(hidden_size={self.hidden_size}, eps={self.eps}, "
            f"dtype={self.dtype})"
        )
