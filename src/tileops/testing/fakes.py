"""A recording fake target for tests: real kernels (the torch references), plus a log of
every builder call and kernel call, so tests can assert what crossed the boundary."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import manifest
from ..backend import TensorSpec, register_detector, register_kernel_builder
from . import references


@dataclasses.dataclass
class KernelCall:
    op: str
    contiguous: tuple[bool | None, ...]
    devices: tuple[torch.device | None, ...]


@dataclasses.dataclass
class RecordingTarget:
    """Registers ``name`` claiming devices of ``device_type`` with a builder for ``ops``
    (every manifest op by default). Kernels compute with the references; on the meta
    device they return empty outputs of the manifest's shapes."""

    name: str
    device_type: str = "cpu"
    ops: tuple[str, ...] | None = None
    builds: list[tuple[str, tuple[TensorSpec | None, ...], dict[str, Any]]] = dataclasses.field(default_factory=list)
    calls: list[KernelCall] = dataclasses.field(default_factory=list)

    def register(self) -> RecordingTarget:
        register_detector(self.name, self.detect)
        for op in self.ops or sorted(manifest.all_entries()):
            register_kernel_builder(op, self.name, self._builder(op))
        return self

    def detect(self, device: torch.device) -> bool:
        return device.type == self.device_type

    def builds_of(self, op: str) -> list[tuple[tuple[TensorSpec | None, ...], dict[str, Any]]]:
        return [(specs, params) for name, specs, params in self.builds if name == op]

    def _builder(self, op: str):
        entry = manifest.entry(op)
        reference = references.reference(op)

        def build(*specs: TensorSpec | None, **params: Any):
            self.builds.append((op, specs, dict(params)))
            metas = entry.output_meta(specs, params)

            def kernel(*tensors: torch.Tensor | None):
                self.calls.append(
                    KernelCall(
                        op,
                        tuple(None if t is None else t.is_contiguous() for t in tensors),
                        tuple(None if t is None else t.device for t in tensors),
                    )
                )
                device = next(t.device for t in tensors if t is not None)
                if device.type == "meta":
                    outs = tuple(torch.empty(s, dtype=d, device=device) for d, s in metas)
                    return outs[0] if len(outs) == 1 else outs
                result = reference(*tensors, **params)
                if params.get("inplace"):
                    tensors[0].copy_(result)
                    return tensors[0]
                return result

            return kernel

        build.__qualname__ = f"RecordingTarget.build_{op}"
        return build
