from __future__ import annotations

from ..op import Op


class AddFwdOp(Op):
    """torch.add(input, other, alpha=alpha) with broadcasting. ``AddFwdOp(*, alpha=1)``."""


class MulFwdOp(Op):
    """torch.mul(input, other) with broadcasting. ``MulFwdOp()``."""
