"""Activations that can write their input (``inplace=True``); the other ops of this
module (GeluFwdOp, SiluAndMulFwdOp) are generated from their manifest entries."""

from __future__ import annotations

from .. import _catalog
from ..op import Op

# The ops of this module that are generated from their entries, made on first use.
__getattr__, __dir__ = _catalog.lazy_members(__name__)


class _InPlaceCapable(Op):
    """Activations with ``inplace=True`` write the caller's input and return that tensor."""

    _abstract = True
    _inplace_form = True

    def _returns_input(self) -> bool:
        return bool(self.params["inplace"])

    def _return_slot(self) -> int:
        return 0

    def _configure_return(self) -> None:
        if self._returns_input():
            self._dispatcher.set_return_slot(self._return_slot())


class SiluFwdOp(_InPlaceCapable):
    """torch.nn.functional.silu. ``SiluFwdOp(*, inplace=False)``, then ``op(input)``."""


class ReluFwdOp(_InPlaceCapable):
    """torch.nn.functional.relu. ``ReluFwdOp(*, inplace=False)``, then ``op(input)``."""
