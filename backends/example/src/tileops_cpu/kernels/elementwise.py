"""Elementwise: AddFwdOp, and the gated activations of an MLP (SiluAndMulFwdOp,
GeluTanhAndMulFwdOp, GeluAndMulFwdOp)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F


class CpuAdd:
    """output = input + alpha * other, broadcasting as ``torch.add`` does (any shapes that
    broadcast, every dtype of the manifest)."""

    def __init__(self, alpha: int | float, dtype: torch.dtype) -> None:
        self.alpha = alpha
        self.dtype = dtype

    @torch.no_grad()
    def __call__(self, input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return torch.add(input, other, alpha=self.alpha)

    def __repr__(self) -> str:
        return f"CpuAdd(alpha={self.alpha!r}, dtype={self.dtype})"


class CpuGatedActivation:
    """activation(gate) * value for x [M, 2N] = [gate | value] -> [M, N], in float32."""

    ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "silu": F.silu,
        "gelu": F.gelu,  # exact (erf)
        "gelu_tanh": partial(F.gelu, approximate="tanh"),
    }

    def __init__(self, activation: str, dtype: torch.dtype) -> None:
        if activation not in self.ACTIVATIONS:
            raise ValueError(
                f"CpuGatedActivation activation must be one of {sorted(self.ACTIVATIONS)}, "
                f"got {activation!r}"
            )
        self.activation = activation
        self.dtype = dtype
        self._act = self.ACTIVATIONS[activation]

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = x.float().chunk(2, dim=-1)
        return (self._act(gate) * value).to(self.dtype)

    def __repr__(self) -> str:
        return f"CpuGatedActivation(activation={self.activation!r}, dtype={self.dtype})"
