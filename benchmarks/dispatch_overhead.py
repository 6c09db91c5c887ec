"""Op-layer overhead on a memo hit, measured side by side in one run.

Three things are timed in interleaved rounds (these machines are noisy; the median of
the rounds is reported):

* ``op(a, b)``          an AddFwdOp whose target's kernel does nothing but return a
                        preallocated tensor (the trivial kernel);
* ``kernel(a, b)``      that same kernel called directly;
* ``torch.add(a, b)``   one tiny eager torch op, for scale;
* ``compiled op``       per call, the op ten times over inside one torch.compile'd
                        function (its ``tileops::`` custom op, under inference_mode, as
                        a serving engine's compiled model calls it).

Targets (design.md): overhead = op - kernel <= 0.5 us, and <= 0.5 x torch.add.

    python benchmarks/dispatch_overhead.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tileops
from tileops.backend import discovery, register_detector, register_kernel_builder


def per_call_ns(fn, args, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter_ns() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    discovery.ensure_discovered()
    out = torch.ones(4)

    def trivial_kernel(a, b):
        return out

    register_detector("bench_cpu", lambda device: device.type == "cpu")
    register_kernel_builder("AddFwdOp", "bench_cpu", lambda i, o, *, alpha: trivial_kernel)
    from tileops.ops import AddFwdOp

    op = AddFwdOp(target="bench_cpu")
    a, b = torch.ones(4), torch.ones(4)
    op(a, b)  # build once: everything after is a memo hit

    def ten_calls(x, y):
        for _ in range(10):
            x = op(x, y)
        return x

    compiled = torch.compile(ten_calls, fullgraph=True)
    with torch.inference_mode():
        compiled(a, b)

    rows = {"op": [], "kernel": [], "torch.add": [], "compiled op": []}
    for _ in range(args.rounds):
        rows["op"].append(per_call_ns(op, (a, b), args.calls))
        rows["kernel"].append(per_call_ns(trivial_kernel, (a, b), args.calls))
        rows["torch.add"].append(per_call_ns(torch.add, (a, b), args.calls))
        with torch.inference_mode():
            rows["compiled op"].append(per_call_ns(compiled, (a, b), args.calls // 10) / 10)
    med = {name: statistics.median(values) for name, values in rows.items()}
    overhead = med["op"] - med["kernel"]

    print(
        f"tileops {tileops.__version__}, torch {torch.__version__}, "
        f"DLPack exchange: {tileops.ops._runtime.USES_DLPACK_EXCHANGE}"
    )
    print(f"{'call':<12}{'median ns':>12}")
    for name, value in med.items():
        print(f"{name:<12}{value:>12.0f}")
    print(
        f"op-layer overhead on a memo hit: {overhead:.0f} ns "
        f"(target <= 500 ns: {'met' if overhead <= 500 else 'MISSED'})"
    )
    ratio = overhead / med["torch.add"]
    print(f"overhead / torch.add: {ratio:.2f}x (target <= 0.5x: {'met' if ratio <= 0.5 else 'MISSED'})")
    print(f"op / torch.add: {med['op'] / med['torch.add']:.2f}x")


if __name__ == "__main__":
    main()
