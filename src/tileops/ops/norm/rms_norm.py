from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..op import Op


class RMSNormFwdOp(Op):
    """y = x / sqrt(mean(x², over normalized_shape) + eps) · weight.

    ``RMSNormFwdOp(normalized_shape, eps=1e-6)``, then ``op(x, weight)``.
    """

    def _in_tree_key(self, tensors: Sequence[torch.Tensor | None]) -> tuple:
        # Compiled per hidden size and dtype; the row count stays a call-time value.
        return (math.prod(self.params["normalized_shape"]), tensors[0].dtype)
