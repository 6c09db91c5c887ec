from __future__ import annotations

from collections.abc import Sequence

import torch

from ..op import Op


class FusedAddRMSNormFwdOp(Op):
    """r = x + residual; returns (rms_norm(r, last dim) · weight, r).

    ``FusedAddRMSNormFwdOp(eps=1e-6)``, then ``op(x, residual, weight)``.
    """

    def _in_tree_key(self, tensors: Sequence[torch.Tensor | None]) -> tuple:
        return (tensors[0].shape[-1], tensors[0].dtype)
