"""The main job: tileops on a CPU with two backends installed, end to end.

Run by `make demo`, in a virtual environment where the example backend (target
`torch_cpu`) and the native C++ backend (target `native_cpu`) are pip-installed — which
is all it takes for tileops to find them.
"""

from __future__ import annotations

import copy
import pathlib
import statistics
import sys

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
from tileops.integrations.transformers import enable
from tileops.ops import RMSNormFwdOp
from tileops.testing.agreement import check_greedy_agreement

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import hf_llama  # noqa: E402


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

    section("4. A Hugging Face Llama on native_cpu: one call")
    set_default_target("native_cpu")
    hf_model = hf_llama.load()  # 155.7M parameters, bf16, random weights
    fast = copy.deepcopy(hf_model)
    report = enable(fast)  # the process default chose native_cpu
    print(report)
    tokenizer = hf_llama.ByteTokenizer()
    ids = tokenizer.encode(hf_llama.PROMPT)
    new, rounds = 32, 3
    systems = {"HF eager": hf_model, "HF + tileops": fast}
    for model in systems.values():
        hf_llama.generate(model, ids, 2)  # warm up: kernels are built on first use
    runs = {name: [] for name in systems}
    for _ in range(rounds):  # alternated, medians: a shared machine's speed moves by the minute
        for name, model in systems.items():
            runs[name].append(hf_llama.generate(model, ids, new))
    results = {}
    for name, each in runs.items():
        prefill, decode = (statistics.median(run[i] for run in each) for i in (2, 3))
        results[name] = (*each[-1][:2], prefill, decode)
        print(f"{name:<14} prefill {prefill:8.1f} tokens/s   decode {decode:6.1f} tokens/s   (medians of {rounds} runs)")
    (ref, ref_logits, ref_prefill, ref_decode), (got, _, prefill, decode) = results["HF eager"], results["HF + tileops"]
    logits = torch.stack(ref_logits)
    tolerance = 0.004 + 0.02 * float(logits.float().abs().max())  # the equivalence tests' bf16 rule
    try:
        sure = min(check_greedy_agreement(logits, ref[None], got[None], tolerance))
        verdict = f"agree (the reference is sure for {sure} of {new} steps)"
    except AssertionError as error:
        verdict = f"DISAGREE: {error}"
    print(f"speed-up: prefill {prefill / ref_prefill:.2f}x, decode {decode / ref_decode:.2f}x; "
          f"{int((ref == got).int().cumprod(0).sum())} of {new} greedy tokens identical, {verdict}")
    print(f"first tokens: {got[:12].tolist()} (random weights, so not text)")

    section("5. target=BUILTIN: the in-tree kernels are CUDA kernels")
    try:
        RMSNormFwdOp(normalized_shape=(4096,), target=BUILTIN)(x, weight)
    except ValueError as error:
        print(f"ValueError: {error}")
    set_default_target(None)


if __name__ == "__main__":
    main()
