"""What every reference builds on (tileops.testing.references): the tensor types, and the
rule that low-precision floats are computed in float32 and cast back to the input's dtype
(in their own dtype within ``references.in_input_dtype()``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

Tensor = torch.Tensor
RefResult = Tensor | tuple[Tensor, ...]

_LOW_PRECISION = (torch.float16, torch.bfloat16)

_IN_INPUT_DTYPE = [False]  # set by in_input_dtype(): compute as a same-dtype eager call


@contextlib.contextmanager
def in_input_dtype() -> Iterator[None]:
    """Within it, references compute float16/bfloat16 in that dtype (as a PyTorch user's
    eager call does) instead of in float32: a speed baseline (``tileops bench``), not a
    numeric one. Process-wide while it lasts."""
    saved = _IN_INPUT_DTYPE[0]
    _IN_INPUT_DTYPE[0] = True
    try:
        yield
    finally:
        _IN_INPUT_DTYPE[0] = saved


def _up(t: Tensor | None) -> Tensor | None:
    """float32 copy of a low-precision float tensor; anything else as is."""
    if t is not None and t.dtype in _LOW_PRECISION and not _IN_INPUT_DTYPE[0]:
        return t.float()
    return t


def _down(result: Tensor, like: Tensor) -> Tensor:
    return result.to(like.dtype)
