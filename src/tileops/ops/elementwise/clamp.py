from __future__ import annotations

from ..op import Op


class ClampFwdOp(Op):
    """torch.clamp with tensor bounds; at least one of min and max is given.

    ``ClampFwdOp()``, then ``op(input, min=None, max=None)``.
    """
