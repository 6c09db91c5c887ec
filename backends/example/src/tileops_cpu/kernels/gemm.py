"""Matrix products: GemmFwdOp, as a GEMM or, for a single row or column, a GEMV."""

from __future__ import annotations

import torch


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
        return (
            f"CpuGemv(side={self.side!r}, trans_a={self.trans_a}, trans_b={self.trans_b}, "
            f"dtype={self.dtype})"
        )
