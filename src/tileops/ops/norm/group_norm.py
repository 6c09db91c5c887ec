from __future__ import annotations

import torch

from ..op import Op


class GroupNormFwdOp(Op):
    """torch.nn.functional.group_norm over x [N, C, *spatial]. weight and bias are given
    together or not at all (the "affine" switch), which picks the kernel role.

    ``GroupNormFwdOp(num_groups, eps=1e-5)``, then ``op(x, weight=None, bias=None)``.
    """

    def _fetch(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None):
        role = "group_norm_no_affine" if weight is None else "group_norm"
        return self.get_or_build_kernel(
            role,
            (x, weight, bias),
            key=(role, x.shape[1], x.dtype),
            build=self._in_tree(role, (x, weight, bias)),
        )
