from __future__ import annotations

from ..op import Op


class SumFwdOp(Op):
    """torch.sum over ``dim`` (None: every axis), optionally keeping reduced axes.

    ``SumFwdOp(dim=None, keepdim=False)``, then ``op(x)``.
    """


class MeanFwdOp(Op):
    """torch.mean over ``dim`` (None: every axis). ``MeanFwdOp(dim=None, keepdim=False)``."""


class AmaxFwdOp(Op):
    """torch.amax over ``dim`` (None: every axis). ``AmaxFwdOp(dim=None, keepdim=False)``."""
