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
import smollm2  # noqa: E402

QUESTION = "Why is the sky blue? Explain it in a short paragraph."
NEW_TOKENS = 64
ROUNDS = 3


def section(title: str) -> None:
    print(f"\n== {title}")


def agreement(ref: torch.Tensor, ref_logits: torch.Tensor, got: torch.Tensor) -> str:
    """How far two greedy answers agree, by the equivalence tests' bf16 rule: token for token
    while HF eager's top-two margin is above the rounding tolerance; where it is not, bf16
    rounding may pick either token and the answers may part there."""
    n = min(len(ref), len(got))
    same = int((ref[:n] == got[:n]).int().cumprod(0).sum())
    if same == len(ref) == len(got):
        return f"the same answer, token for token ({same} tokens)"
    tolerance = 0.004 + 0.02 * float(ref_logits.float().abs().max())
    try:
        sure = check_greedy_agreement(ref_logits[:n], ref[None, :n], got[None, :n], tolerance)[0]
    except AssertionError as error:
        return f"DISAGREE where HF eager is sure: {error}"
    top2 = ref_logits[same, 0].float().topk(2).values
    margin = float(top2[0] - top2[1])
    side = "within" if margin <= tolerance else "beyond"
    return (
        f"the same {same} tokens, then apart at token {same + 1}, where HF eager's top two logits are "
        f"{margin:.3f} apart, {side} bf16 rounding ({tolerance:.3f}); HF eager was sure for the first {sure}"
    )


def main() -> None:
    print(f"tileops {tileops.__version__} on torch {torch.__version__}, {torch.get_num_threads()} threads")

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

    section("4. A real chat model on native_cpu: one call")
    set_default_target("native_cpu")
    print(f"loading {smollm2.GGUF.name} (SmolLM2-135M-Instruct, transformers' GGUF loader, bf16) ...")
    tokenizer, hf_model = smollm2.load()
    fast = copy.deepcopy(hf_model)
    report = enable(fast)  # the process default chose native_cpu
    print(report)
    print("\nand again with tileops' loader, the file's Q4_1/Q8_0 blocks kept as they are (GemmGgufFwdOp) ...")
    blocks = smollm2.load_blocks()
    print(blocks.tileops_report)
    ids = smollm2.chat_prompt(tokenizer, QUESTION)
    print(f"\nuser: {QUESTION}")
    systems = {"HF eager (bf16)": hf_model, "HF + tileops (bf16)": fast, "HF + tileops (GGUF blocks)": blocks}
    for model in systems.values():
        smollm2.answer(model, ids, 2)  # warm up: kernels are built on first use
    runs = {name: [] for name in systems}
    for _ in range(ROUNDS):  # alternated, medians: a shared machine's speed moves by the minute
        for name, model in systems.items():
            runs[name].append(smollm2.answer(model, ids, NEW_TOKENS))
    speeds = {}
    for name, each in runs.items():
        prefill, decode = (statistics.median(run[i] for run in each) for i in (2, 3))
        speeds[name] = prefill, decode
        text = tokenizer.decode(each[-1][0], skip_special_tokens=True).strip()
        print(f"{name}: {text}")
        print(
            f"  ({len(each[-1][0])} tokens; prefill {prefill:.0f} tokens/s, decode {decode:.1f} tokens/s, "
            f"medians of {ROUNDS} runs; weights {smollm2.weight_bytes(systems[name]) / 1e6:.0f} MB)"
        )
    ref_prefill, ref_decode = speeds["HF eager (bf16)"]
    ref, ref_logits, *_ = runs["HF eager (bf16)"][-1]
    for name in list(systems)[1:]:
        prefill, decode = speeds[name]
        print(f"{name} against HF eager: prefill {prefill / ref_prefill:.2f}x, decode {decode / ref_decode:.2f}x")
        print(f"  {agreement(ref, ref_logits, runs[name][-1][0])}")
    print(
        "(the blocks hold the file's own weights, which bf16 rounds: where two tokens are nearly tied, "
        "either model may pick either)"
    )

    section("5. target=BUILTIN: the in-tree kernels are CUDA kernels")
    try:
        RMSNormFwdOp(normalized_shape=(4096,), target=BUILTIN)(x, weight)
    except ValueError as error:
        print(f"ValueError: {error}")
    set_default_target(None)


if __name__ == "__main__":
    main()
