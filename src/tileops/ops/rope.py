from __future__ import annotations

from .op import Op


class RopeNeoxFwdOp(Op):
    """NeoX-style rotary embedding at positions 0..S-1 (half-split rotation).

    layout "1d": x [S, D]; "2d": x [B, S, H, D]. The cos/sin tables are the kernel's
    business (built from ``base``), not inputs. ``RopeNeoxFwdOp(layout="1d", base=10000.0)``.
    """


class RopeNeoxPositionIdsFwdOp(Op):
    """NeoX-style rotary embedding at explicit positions (decode), on the first
    ``rotary_dim`` channels of each head. x [T, H, D], position_ids [T]."""
