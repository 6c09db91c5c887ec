"""The RoPE ops. All but the two LongRoPE ones are generated from their manifest entries
(``manifest/position_encoding.yaml``); those also take their ``rescale_factors`` as a
1-D tensor, as upstream's LongRoPE does, and hold them as a tuple of floats (the manifest's
``list[float] | tuple[float, ...] | None``) from construction on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from . import _catalog
from .op import Op

# The ops of this module that are generated from their entries, made on first use.
__getattr__, __dir__ = _catalog.lazy_members(__name__)


def _factors_from_tensor(op: str, factors: Any) -> Any:
    if not isinstance(factors, torch.Tensor):
        return factors  # a list, tuple or None: the manifest judges it
    if factors.ndim != 1 or factors.dtype == torch.bool or factors.is_complex():
        raise ValueError(
            f"{op}: rescale_factors as a tensor must be 1-D and real, one factor per rotated "
            f"pair; got shape {tuple(factors.shape)}, dtype {factors.dtype}"
        )
    return tuple(float(f) for f in factors.detach().cpu().tolist())


class _TakesRescaleTensor(Op):
    _abstract = True

    def _setup(self, params: Mapping[str, Any], **kwargs: Any) -> None:
        given = dict(params)
        given["rescale_factors"] = _factors_from_tensor(type(self).__name__, given.get("rescale_factors"))
        super()._setup(given, **kwargs)


class RopeLongRopeFwdOp(_TakesRescaleTensor):
    """NeoX rotary embedding at positions 0..S-1 with LongRoPE frequencies.

    ``f_k = 1 / (rescale_factors[k] * base ** (k / half))`` (None: all ones); when
    ``max_position_embeddings > original_max_position_embeddings`` cos and sin are scaled by
    ``sqrt(1 + ln(max / orig) / ln(orig))``. ``rescale_factors``: head_dim / 2 floats, as a
    list, tuple or 1-D tensor.

    ``RopeLongRopeFwdOp(layout="1d", base=10000.0, rescale_factors=None,
    max_position_embeddings=4096, original_max_position_embeddings=4096)``, then ``op(x)``
    with x [S, D] ('1d') or [B, S, H, D] ('2d').
    """


class RopeLongRopePositionIdsFwdOp(_TakesRescaleTensor):
    """RopeLongRopeFwdOp's frequencies and cos/sin factor at explicit positions (decode), on
    the first rotary_dim channels of each head.

    ``rescale_factors``: rotary_dim / 2 floats, as a list, tuple or 1-D tensor.
    ``max_position`` sizes the cos/sin table; ``max_position_embeddings`` only sets the factor.

    ``RopeLongRopePositionIdsFwdOp(max_position, base=10000.0, *, rotary_dim,
    rescale_factors=None, max_position_embeddings=4096, original_max_position_embeddings=4096)``,
    then ``op(x, position_ids)`` with x [T, H, D], position_ids [T] (int32 or int64).
    """
