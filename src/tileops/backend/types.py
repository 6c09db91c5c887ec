"""What crosses the boundary between the op layer and a backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

if TYPE_CHECKING:
    from typing import TypeAlias


class TensorSpec(NamedTuple):
    """A description of one input tensor: never the tensor, never its data.

    The op layer builds these and hands them to ``build_kernel``. Because no tensor
    travels, a builder cannot read data (the memo is keyed by device and shape only)
    and cannot keep a tensor alive inside a cached kernel.
    """

    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]


class _Builtin:
    """The in-tree kernels: not a target, never registered, compared by identity."""

    _instance: _Builtin | None = None

    def __new__(cls) -> _Builtin:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "BUILTIN"

    def __reduce__(self) -> str:
        return "BUILTIN"


BUILTIN = _Builtin()

#: A target is a registered name, or ``BUILTIN`` for the in-tree kernels.
Target: TypeAlias = str | _Builtin

#: What a kernel returns: one tensor, a tuple in ``signature.outputs`` order, or ``None``
#: for a purely in-place op.
KernelResult: TypeAlias = torch.Tensor | tuple[torch.Tensor, ...] | None


class BuildKernel(Protocol):
    """``build_kernel(*inputs, **params) -> kernel``; one per (op, target).

    Positional arguments are ``TensorSpec`` (or ``None`` for an optional input not
    passed) in ``signature.inputs`` order; keyword arguments are every manifest param,
    resolved to a concrete value. The result only has to be callable as
    ``kernel(*tensors)``.
    """

    def __call__(self, *inputs: TensorSpec | None, **params: object) -> Callable[..., KernelResult]: ...


Detect = Callable[[torch.device], bool]
