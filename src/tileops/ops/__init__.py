"""Every tileops op: one class per manifest entry (``tileops/manifest/*.yaml``), at the
module the entry names and here. Each is constructed with its manifest params plus
keyword-only ``target``, ``kernel_map``, ``tune``.

    from tileops.ops import RMSNormFwdOp
    y = RMSNormFwdOp(normalized_shape=(4096,))(x, weight)

A class is made on first use (``_catalog``): importing this package parses no manifest.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from .. import manifest as _manifest
from . import _catalog

if _TYPE_CHECKING:
    from .op import Op

    #: Every op class, in manifest order.
    ALL_OPS: tuple[type[Op], ...]

_catalog.install()

__all__ = [*_manifest.index(), "ALL_OPS", "Op"]

_member, _members = _catalog.lazy_members(__name__)


def __getattr__(name: str) -> object:
    if name == "ALL_OPS":
        value: object = _catalog.all_ops()
    elif name == "Op":
        from .op import Op

        value = Op
    else:
        return _member(name)  # an op class (made now) or a subpackage
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*_members(), "ALL_OPS", "Op"})
