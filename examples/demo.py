"""The main job: tileops on a CPU with two backends installed, end to end.

Run by `make demo`, in a virtual environment where the example backend (target
`torch_cpu`) and the native C++ backend (target `native_cpu`) are pip-installed — which
is all it takes for tileops to find them.
"""

from __future__ import annotations

import pathlib
import sys
import time

import torch
import torch.nn.functional as F

import tileops
from tileops.backend import (
    BUILTIN,
    AmbiguousTargetError,
    load_failures,
    registered_targets,
    set_default_target,
)
from tileops.ops import RMSNormFwdOp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import llama_step  # noqa: E402


def section(title: str) -> None:
    print(f"\n== {title}")


def main() -> None:
    print(
        f"tileops {tileops.__version__} on torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )

    section("1. Discovery: installed backends register themselves")
    x = torch.randn(8, 4096, dtype=torch.bfloat16)
    weight = torch.randn(4096, dtype=torch.bfloat16)
    op = RMSNormFwdOp(normalized_shape=(4096,))  # the first op construction runs discovery
    print("registered targets:", registered_targets())
    print("targets serving RMSNormFwdOp:", registered_targets("RMSNormFwdOp"))
    print("load failures:", load_failures())

    section("2. Layer one: both targets claim the CPU, so a call must choose")
    try:
        op(x, weight)
    except AmbiguousTargetError as error:
        print(f"AmbiguousTargetError: {error}")

    section("3. target='torch_cpu': the example backend's kernel")
    op = RMSNormFwdOp(normalized_shape=(4096,), target="torch_cpu")
    y = op(x, weight)
    same = torch.equal(y, F.rms_norm(x, (4096,), weight, 1e-6))
    print(f"settled on {op.settled_target!r}; bit-identical to F.rms_norm: {same}")

    section("4. The process default: native C++ kernels for a Llama-style decoder")
    set_default_target("native_cpu")
    cfg = llama_step.Config()
    weights = llama_step.make_weights(cfg)
    steps = 32
    timings = {}
    outputs = {}
    for name, decoder in (
        ("tileops/native_cpu", llama_step.TileopsDecoder(cfg, weights)),
        ("torch eager", llama_step.EagerDecoder(cfg, weights)),
    ):
        llama_step.generate(decoder, cfg, 4)  # warm up: kernels are built on first use
        start = time.perf_counter()
        outputs[name] = llama_step.generate(decoder, cfg, steps)
        timings[name] = steps / (time.perf_counter() - start)
        print(f"{name:<20} {timings[name]:8.1f} tokens/s")
    diff = (outputs["tileops/native_cpu"].float() - outputs["torch eager"].float()).abs().max()
    print(
        f"speed-up {timings['tileops/native_cpu'] / timings['torch eager']:.2f}x; "
        f"max |difference| over {steps} tokens: {diff.item():.2e}"
    )

    section("5. target=BUILTIN: the in-tree kernels are CUDA kernels")
    try:
        RMSNormFwdOp(normalized_shape=(4096,), target=BUILTIN)(x, weight)
    except ValueError as error:
        print(f"ValueError: {error}")
    set_default_target(None)


if __name__ == "__main__":
    main()
