"""GEMMs over quantized weights (manifest: gemm_quantized.yaml): ``GemmGgufFwdOp`` is
generated from its entry; ``GemmW4A16FwdOp`` adds upstream TileOPs' ``repack`` step."""

from __future__ import annotations

import torch

from .. import _catalog
from ..op import Op

# The ops of this module that are generated from their entries, made on first use.
__getattr__, __dir__ = _catalog.lazy_members(__name__)


class GemmW4A16FwdOp(Op):
    """``activation [M, K] @ W.T`` with W 4-bit in groups of ``group_size`` along K:
    ``(q - weight_zero) * weight_scale``, q in ``packed_weight`` ``[N, K / 2]`` (K index 2i
    in the low nibble of byte i, 2i + 1 in the high one; ``tileops.quant.int4``).

    ``GemmW4A16FwdOp(group_size=128)``, then ``op.repack(packed_weight)`` once where the
    weight is loaded, then ``op(activation, packed, weight_scale, weight_zero)``.
    """

    def repack(self, packed_weight: torch.Tensor) -> torch.Tensor:
        """``packed_weight`` in the order this op's target's kernels read, as upstream's
        ``repack`` is: the layout the target registered (``register_weight_layout``), or the
        tensor as it is where its kernels read the order above."""
        return self.prepare_weight("packed_weight", packed_weight)
