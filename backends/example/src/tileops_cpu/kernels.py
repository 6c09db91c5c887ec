"""The kernels of target ``torch_cpu``, in plain PyTorch: norms, GEMMs and elementwise ops
here; attention, RoPE and mixture-of-experts kernels in ``attention.py``, ``rope.py`` and
``moe.py`` beside this file.

A kernel is an object built once per device and input signature and then called many
times. Its constructor takes compile-time values only: the things a real backend would
bake into generated code (dtype, a hidden size, a layout, head counts, RoPE frequencies).
Everything that changes from call to call — the row count of an RMSNorm, M of a GEMM, the
tokens of a decode step, offsets and page tables — is read from the tensors in
``__call__``. ``CpuRMSNorm`` therefore never sees a row count: on a decode path the batch
grows step by step, and a constructor that took it would rebuild at every step.

Kernels compute values, not autograd graphs: the op layer has no backward, so every
``__call__`` runs under ``torch.no_grad()`` (a compiled kernel records nothing either).
Half-precision inputs are computed in float32 and rounded once, as the references are.

On real hardware these are the files to replace: compile in ``__init__``, launch on the
current stream in ``__call__``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

__all__ = ["CpuAdd", "CpuFusedAddRMSNorm", "CpuGatedActivation", "CpuGemm", "CpuGemv", "CpuRMSNorm"]


# ---- norms ---------------------------------------------------------------------------


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
        return f"CpuRMSNorm(normalized_shape={self.normalized_shape}, eps={self.eps}, dtype={self.dtype})"


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
        return f"CpuFusedAddRMSNorm(hidden_size={self.hidden_size}, eps={self.eps}, dtype={self.dtype})"


# ---- matrix products -----------------------------------------------------------------


def _operands(a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """op(a) [M, K] and op(b) [K, N] as views: a transpose costs no copy."""
    return (a.t() if trans_a else a), (b.t() if trans_b else b)


class CpuGemm:
    """d = op(a) @ op(b), the general case."""

    def __init__(self, trans_a: bool, trans_b: bool, dtype: torch.dtype) -> None:
        self.trans_a = trans_a
        self.trans_b = trans_b
        self.dtype = dtype

    @torch.no_grad()
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

    @torch.no_grad()
    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        lhs, rhs = _operands(a, b, self.trans_a, self.trans_b)
        if self.side == "lhs_row":  # [1, K] @ [K, N] -> [1, N]
            return torch.mv(rhs.t(), lhs[0]).unsqueeze(0)
        return torch.mv(lhs, rhs[:, 0]).unsqueeze(1)  # [M, K] @ [K, 1] -> [M, 1]

    def __repr__(self) -> str:
        return f"CpuGemv(side={self.side!r}, trans_a={self.trans_a}, trans_b={self.trans_b}, dtype={self.dtype})"


# ---- elementwise ---------------------------------------------------------------------


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
                f"CpuGatedActivation activation must be one of {sorted(self.ACTIVATIONS)}, got {activation!r}"
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
