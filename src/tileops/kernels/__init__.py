"""The in-tree kernels: tileops' own implementations, the default when no target claims
a device. They have no target name and are never registered.

They are CUDA kernels. Constructing one for a device it cannot serve raises the error
the protocol page quotes (requirement G1). The CUDA implementations themselves are not
built in this installation yet, so on a CUDA device they say exactly that. Nothing
here queries CUDA (C9): the device type is read from the input specs. Nothing here reads
the dispatch tables either: the op layer tells a kernel whether another target serves
the device (``served_elsewhere``), and the error texts are the engine's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _C
from ..backend.errors import OpNotAvailableError
from ..backend.types import TensorSpec


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


class InTreeKernel:
    """Base of the in-tree CUDA kernels; ``inputs`` are the op's input specs by name."""

    def __init__(
        self,
        inputs: Mapping[str, TensorSpec | None],
        *,
        served_elsewhere: bool = False,
        **compile_time: Any,
    ) -> None:
        present = {name: spec for name, spec in inputs.items() if spec is not None}
        self.compile_time = compile_time
        kernel = type(self).__name__
        if any(spec.device.type != "cuda" for spec in present.values()):
            where = _join([f"{name} on {spec.device}" for name, spec in present.items()])
            raise ValueError(_C.messages.in_tree_wrong_device(kernel, where, served_elsewhere))
        raise OpNotAvailableError(_C.messages.in_tree_not_built(kernel))

    def __call__(self, *tensors: Any) -> Any:  # pragma: no cover - construction always raises
        raise OpNotAvailableError(f"{type(self).__name__} has no implementation here")


_classes: dict[str, type[InTreeKernel]] = {}


def in_tree_kernel(name: str) -> type[InTreeKernel]:
    """The in-tree kernel class a manifest's kernel_map names (e.g. ``RMSNormKernel``)."""
    cls = _classes.get(name)
    if cls is None:
        cls = _classes[name] = type(name, (InTreeKernel,), {"__module__": __name__})
    return cls
