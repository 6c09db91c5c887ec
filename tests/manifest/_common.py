"""What the manifest tests share: the shipped ops, specs and small real inputs for a case,
a workload by name, and a toy entry to write and break."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from tileops import manifest
from tileops.backend.types import TensorSpec
from tileops.manifest import OpEntry
from tileops.testing.harness import index_inputs

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
CPU = torch.device("cpu")
META = torch.device("meta")
# Every shipped op: the manifests are the list (no hand copy to keep in step).
OPS = sorted(manifest.all_entries())


def specs(e: OpEntry, shapes: dict, dtype: torch.dtype = F16, device: torch.device = META) -> list:
    """TensorSpecs for ``shapes`` (input name -> shape; a missing name is an absent input)."""
    return [
        None if shapes.get(n) is None else TensorSpec(device, dt, tuple(shapes[n]))
        for n, dt in zip(e.input_names(), e.case_dtypes(dtype))
    ]


def make_inputs(e: OpEntry, shapes: dict, dtype: torch.dtype, params: dict) -> list:
    """Small real tensors for a case; position ids stay below max_position, and what value
    rules read (offsets, lengths, page tables) is what the harness makes valid."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for name, dt in zip(e.input_names(), e.case_dtypes(dtype)):
        shape = shapes.get(name)
        if shape is None:
            out.append(None)
        elif dt.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dt))
        elif name == "position_ids":
            out.append(torch.randint(0, params["max_position"], shape, generator=gen).to(dt))
        else:
            out.append(torch.randint(0, 2 if dt == torch.bool else 100, shape, generator=gen).to(dt))
    if e.value_rules:
        chosen = index_inputs(e, shapes, params, gen)
        out = [chosen.get(name, t) for name, t in zip(e.input_names(), out)]
    return out


def workload(e: OpEntry, name: str, dtype: torch.dtype) -> tuple[dict, dict]:
    for n, shapes, params, dt in e.workload_cases("full"):
        if n == name and dt == dtype:
            return shapes, params
    raise AssertionError(f"{e.name} has no workload {name} in {dtype}")


TOY = {
    "ToyOp": {
        "family": "norm",
        "module": "tileops.ops.toy",
        "ref_api": "torch.nn.functional.rms_norm",
        "signature": {
            "inputs": {"x": {"dtype": "float16 | bfloat16"}, "weight": {"dtype": "same_as(x)"}},
            "outputs": {"output": {"dtype": "same_as(x)", "shape": "x.shape"}},
            "params": {"eps": {"type": "float", "default": 1e-6}},
            "shape_rules": ["weight.shape == (x.shape[-1],)"],
        },
        "roofline": {"flops": "x.numel", "bytes": "2 * x.numel * eb"},
        "kernel_map": {"toy": "ToyKernel"},
        "workloads": [{"name": "w", "x": [4, 8], "weight": [8], "dtypes": ["float16"]}],
    }
}


def write(tmp_path: Path, data: object, name: str = "toy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path
