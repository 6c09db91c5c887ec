from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..op import Op


class LayerNormFwdOp(Op):
    """torch.nn.functional.layer_norm with weight and bias.

    ``LayerNormFwdOp(normalized_shape, eps=1e-5)``, then ``op(x, weight, bias)``.
    """

    def _in_tree_key(self, tensors: Sequence[torch.Tensor | None]) -> tuple:
        return (math.prod(self.params["normalized_shape"]), tensors[0].dtype)
