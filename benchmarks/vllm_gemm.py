"""tileops' GemmFwdOp against vLLM's CPU GEMM (oneDNN on weights it packed at load), over a
model's worth of linear weights streamed from memory, as a decode step reads them.

Each pass runs every weight of ``--layers`` layers once (SmolLM2-135M's q/k/v, o, gate/up
and down shapes by default: 212 MB in bfloat16, past any cache), with ``m`` activation rows
(a batch of decode steps). The two alternate pass by pass in one process; the medians of
``--passes`` are reported, with GB/s of weight read and the time ratio.

    .venv-vllm/bin/python benchmarks/vllm_gemm.py [--rows 1 2 4 8 16] [--threads 1]

Needs vLLM (``make bench-vllm`` builds ``.venv-vllm``) and a backend serving GemmFwdOp.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tileops import ops

# (out, in) of one decoder layer's linear weights: SmolLM2-135M (hidden 576, 9 + 3 + 3
# heads of 64, FFN 1536; gate and up merged, as vLLM merges them)
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--threads", type=int, default=1, help="vLLM's CPU worker gets one core by default")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--passes", type=int, default=9)
    args = parser.parse_args()

    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    gemm = ops.GemmFwdOp(False, True)
    weights, packed = [], []
    for _ in range(args.layers):
        for n, k in SHAPES:
            w = torch.randn(n, k).bfloat16()
            layer = torch.nn.Linear(k, n, bias=False).bfloat16()
            layer.weight.data.copy_(w)
            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # what vLLM does at load
            weights.append(w)
            packed.append(layer)
    total = sum(w.numel() * w.element_size() for w in weights)
    print(f"# {args.layers} layers x {len(SHAPES)} weights, {total / 1e6:.0f} MB bfloat16, {args.threads} thread(s)")
    print("| rows | tileops ms | vLLM ms | tileops GB/s | vLLM GB/s | tileops / vLLM time |")
    print("|---|---|---|---|---|---|")
    for m in args.rows:
        xs = {k: torch.randn(m, k).bfloat16() for _, k in SHAPES}

        def tileops_pass(xs=xs) -> None:
            for w in weights:
                gemm(xs[w.shape[1]], w)

        def vllm_pass(xs=xs) -> None:
            for layer in packed:
                layer.cpu_linear(xs[layer.in_features], layer.weight, None)

        times: dict[str, list[float]] = {"tileops": [], "vllm": []}
        for _ in range(2):
            tileops_pass()
            vllm_pass()
        for _ in range(args.passes):
            for name, run in (("tileops", tileops_pass), ("vllm", vllm_pass)):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        ours, theirs = (statistics.median(times[name]) for name in ("tileops", "vllm"))
        print(
            f"| {m} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {total / ours / 1e9:.1f} | {total / theirs / 1e9:.1f} "
            f"| {ours / theirs:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
