from __future__ import annotations

from .op import Op


class BmmFwdOp(Op):
    """torch.bmm: a [B, M, K] @ b [B, K, N], K a multiple of 16.

    ``BmmFwdOp()``, then ``op(a, b)``.
    """
