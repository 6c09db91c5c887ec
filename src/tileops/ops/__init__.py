"""Every tileops op: one class per manifest entry (``tileops/manifest/*.yaml``), at the
module the entry names and here. Each is constructed with its manifest params plus
keyword-only ``target``, ``kernel_map``, ``tune``.

    from tileops.ops import RMSNormFwdOp
    y = RMSNormFwdOp(normalized_shape=(4096,))(x, weight)
"""

from . import _catalog
from .op import Op

_OPS = _catalog.build()
globals().update(_OPS)

#: Every op class, in manifest order.
ALL_OPS: tuple[type[Op], ...] = tuple(_OPS.values())

__all__ = [*_OPS, "ALL_OPS", "Op"]


def __dir__() -> list[str]:
    return sorted({*globals(), *_OPS})
