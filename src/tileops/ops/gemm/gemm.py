from __future__ import annotations

import torch

from ..op import Op


class GemmFwdOp(Op):
    """d = op(a) @ op(b) with op() a transpose where trans_a / trans_b are set; the default
    is NT (d = a @ bᵀ, a [M, K], b [N, K]). Shapes come from the inputs at every call.

    ``GemmFwdOp(trans_a=False, trans_b=True)``, then ``op(a, b)``.
    """

    def _fetch(self, a: torch.Tensor, b: torch.Tensor):
        trans_a, trans_b = self.params["trans_a"], self.params["trans_b"]
        m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
        n = b.shape[0] if trans_b else b.shape[1]
        # The in-tree GEMV serves a single row with NT layout or a single column with NN.
        gemv = (m == 1 and not trans_a and trans_b) or (n == 1 and not trans_a and not trans_b)
        role = "gemv_kernel" if gemv else "gemm_kernel"
        return self.get_or_build_kernel(
            role,
            (a, b),
            key=(role, m, n, k, a.dtype),
            build=self._in_tree(role, (a, b), m=m, n=n, k=k),
        )
