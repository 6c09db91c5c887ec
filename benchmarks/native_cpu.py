"""native_cpu kernels vs torch eager and torch.compile (inductor), side by side.

    .venv-demo/bin/python benchmarks/native_cpu.py            # every op, ~3 minutes on 2 cores
    .venv-demo/bin/python benchmarks/native_cpu.py --no-compile --only RMSNorm,Softmax

Each case is timed as: eager, compiled, native, interleaved over several rounds; a round's
figure is the median of single calls over ~15 ms (at least 5), and the reported time is
the median round. benchmarks/native_latency.py shows the whole distribution.
Workloads are the manifest's, scaled to a CPU where they would take seconds. GB/s uses the
manifest's roofline bytes; memory-bound ops are also shown as a share of the machine's copy
bandwidth (native_cpu's probes: a 256 MiB copy with ordinary and with streaming stores, read
+ write counted, the better of the two). The bandwidth a shared machine gives moves from one
second to the next (docs/performance.md, "native_cpu: machine probes"), so each round
of a memory-bound case runs the probe next to the kernel and the share is the median of the
rounds' shares. Many of these workloads fit in the 32 MiB L3, so shares above 100% are
cache hits; benchmarks/native_latency.py measures beyond the L3.
The MoE block at decode reads a few experts of 1.2 GB of weights: its GB/s counts the
chosen experts' weight bytes and is shown against the read probe (256 MiB, "(of read)");
at prefill its eager side is the per-expert loop of transformers' Qwen3-MoE block.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from native_cpu_cases import cases, spec

from tileops_native_cpu import builders as nb


def time_one(fn: Callable[[], Any], budget_s: float = 0.015) -> float:
    """The median of single calls, as many as fit in the budget (at least 5): a stalled
    call shows up in the spread, never in the figure, and a fast outlier cannot make it."""
    fn()
    clock = time.perf_counter
    times: list[float] = []
    start = clock()
    while len(times) < 5 or (clock() - start < budget_s and len(times) < 2000):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def probe(native, kind: str, repeats: int = 5) -> float:
    """GB/s of a native_cpu machine probe on torch's thread count (256 MiB, the median of
    `repeats`): "read", or "copy" (read + write counted, the better of ordinary and
    streaming stores)."""
    threads = torch.get_num_threads()
    kinds = ("read",) if kind == "read" else ("copy", "copy_stream")
    return max(statistics.median(native.probe_bandwidth(k, 256, threads, repeats)) for k in kinds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (saves most of the run time)")
    ap.add_argument("--only", default="", help="comma-separated op names")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch.set_num_threads for both sides (0: leave torch's default)"
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    native = nb.native()
    bw, bw_read = probe(native, "copy"), probe(native, "read")
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, native_cpu ISA {native.isa()}, "
        f"DLPack exchange API {native.uses_exchange_api()}"
    )
    print(
        f"copy bandwidth at start (native_cpu probes, 256 MiB, read+write, the better of ordinary and streaming "
        f"stores): {bw:.1f} GB/s; read bandwidth at start (256 MiB): {bw_read:.1f} GB/s"
    )
    print(
        "%bw: a memory-bound case's share of the copy probe (of the read probe where marked), run beside it in "
        "every round; the median round's\n"
    )
    hdr = (
        f"{'op':<20} {'workload':<34} {'eager ms':>9} {'compile ms':>10} {'native ms':>9} {'x eager':>8} {'x comp':>7} "
        f"{'GB/s|GF/s':>9} {'%bw':>6}  targets"
    )
    print(hdr)
    print("-" * len(hdr))
    misses = []
    for case in cases():
        if only and case.op not in only:
            continue
        kernel = case.build(*(spec(t) for t in case.inputs), **case.params)
        ins = case.inputs
        # B023 does not apply: these closures are called only within this iteration (timed below)
        ours = lambda: kernel(*ins)  # noqa: E731, B023
        eager = lambda: case.eager(*ins)  # noqa: E731, B023
        compiled = None
        if not args.no_compile:
            try:
                cfn = torch.compile(case.eager, dynamic=False)
                cfn(*ins)
                compiled = lambda: cfn(*ins)  # noqa: E731, B023
            except Exception as e:  # noqa: BLE001
                print(f"  (torch.compile failed for {case.op}: {type(e).__name__})")
        # check agreement once, loosely: this is a benchmark, the tests hold the tolerances
        got, ref = ours(), eager()
        got0 = got[0] if isinstance(got, tuple) else got
        ref0 = ref[0] if isinstance(ref, tuple) else ref
        if case.op == "FusedTopK":  # the router: its ids must agree (its weights are output 0)
            assert torch.equal(got[1], ref[1]), "FusedTopK ids differ from torch.topk's"
        err = (got0.float() - ref0.float()).abs().max().item() / max(1.0, ref0.float().abs().max().item())
        t_e, t_c, t_n, shares = [], [], [], []
        bandwidth_bound = bool(case.bytes and case.memory_bound)
        for _ in range(args.rounds):
            t_e.append(time_one(eager))
            if compiled:
                t_c.append(time_one(compiled))
            ceiling = probe(native, case.bandwidth, repeats=3) if bandwidth_bound else math.nan
            t_n.append(time_one(ours))
            shares.append(case.bytes / t_n[-1] / 1e9 / ceiling)
        e, n = statistics.median(t_e), statistics.median(t_n)
        c = statistics.median(t_c) if t_c else math.nan
        xe, xc = e / n, (c / n if t_c else math.nan)
        share = statistics.median(shares)
        if bandwidth_bound:
            rate_s, share_s = f"{case.bytes / n / 1e9:8.1f}B", f"{share * 100:5.0f}%"
        elif case.flops:
            rate_s, share_s = f"{case.flops / n / 1e9:8.1f}F", "     -"
        else:
            rate_s, share_s = f"{case.bytes / n / 1e9:8.1f}B", "     -"
        goals = []
        ok_e = xe >= case.target_eager
        goals.append(f"eager>={case.target_eager:g}x {'ok' if ok_e else 'MISS'}")
        if t_c:
            ok_c = xc >= case.target_compile
            goals.append(f"compile>=1x {'ok' if ok_c else 'MISS'}")
        if case.memory_bound and case.bytes:
            of = " (of read)" if case.bandwidth == "read" else ""
            goals.append(f"bw>=70%{of} {'ok' if share >= 0.7 else 'MISS'}")
        if err > 0.05:
            goals.append(f"VALUE MISMATCH {err:.3g}")
        line = (
            f"{case.op:<20} {case.label:<34} {e * 1e3:9.3f} {c * 1e3:10.3f} {n * 1e3:9.3f} {xe:8.2f} {xc:7.2f} "
            f"{rate_s:>9} {share_s:>6}  {', '.join(goals)}"
        )
        print(line, flush=True)
        if "MISS" in line or "MISMATCH" in line:
            misses.append(f"{case.op} {case.label}")
    print(f"\n{len(misses)} case(s) miss a target" + (": " + "; ".join(misses) if misses else ""))
    print(pool_line(native))


def pool_line(native) -> str:
    """How native_cpu's parallel regions ran (torch's OpenMP team or its own pool)."""
    if not hasattr(native, "pool_stats"):
        return ""
    rounds, chunks, caller, on_team, stalls, alone = native.pool_stats()
    if not rounds:
        return "native_cpu parallel regions: none"
    return (
        f"native_cpu parallel regions: {rounds}, {on_team / rounds:.0%} on torch's OpenMP team, {stalls} of them "
        f"stalled (waited over 1 ms for a late team thread), {alone} run on the calling thread alone after a stall; "
        f"calling thread ran {caller / max(chunks, 1):.0%} of the chunks"
    )


if __name__ == "__main__":
    sys.exit(main())
