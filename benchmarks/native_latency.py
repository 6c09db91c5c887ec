"""native_cpu latency: the distribution of single calls, in several fresh processes.

    .venv-demo/bin/python benchmarks/native_latency.py                # 3 processes, ~3 minutes on 2 cores
    .venv-demo/bin/python benchmarks/native_latency.py --procs 5 --calls 61 --only RMSNorm,SiluAndMul

Best-of-N hides what a decode loop pays: one stalled call costs more than the kernels save.
So each case is called --calls times, each call timed alone, by tileops and by torch
eager, in --procs fresh processes (each builds its kernels and warms up
on its own). Reported per process: median, p90 and max of both (each side's calls in a
block of their own). The last case is a mixed
loop: a decoder layer as transformers runs it with tileops' norms, RoPE and gated MLP
between torch's linears and attention, against the same layer in plain eager.

Targets, checked in one run:
  tail       in every process, every case's p90 <= 1.5x its median
  stability  across processes, the slowest process's median <= 1.3x the fastest's
  memory     memory-bound cases (every tensor beyond the 32 MiB L3) reach >= 85% of the
             machine's read+write bandwidth (the better of the copy probes)
  gemm       >= 90% of the machine's bfloat16 peak (vdpbf16ps throughput probe; float FMAs
             on a build without AVX-512 BF16)
  gemv       decode GEMVs stream their weights at >= 85% of the read probe
  silu_mul   SiluAndMul 2048x8192 >= 3x torch eager by median
Inputs and weights come on 2 MiB pages, as the product hands them to a kernel: the
transformers integration moves a model's weights there, and native_cpu's outputs of 4 MiB
and more (the next op's inputs) come from its huge-page blocks; both systems get the same
tensors. --small-pages keeps torch's 4 KiB pages instead, where a stream's prefetcher stops
at every page boundary and the TLB misses on nearly every page.
The probes (tileops_native_cpu._C.probe_*) run on threads of their own. The bandwidth a
shared machine gives moves from one second to the next (docs/performance.md,
"native_cpu: machine probes"), so each process runs the bandwidth probe a case is held to
just before and just after that case's calls (3 repeats each), and the case's share in
that process is of the median of those repeats, as benchmarks/native_cpu.py and
hf_generate.py take their probes: the case's own figure is a median, and a probe's best
repeat is a moment the machine gave it (the share of it is printed beside). The bfloat16
peak (compute, steady) is the parent's best repeat.
Last, each process reports its probes' repeats as the machine's own rows, held to the same
tail and stability targets: where a probe misses one, no memory-bound case can meet it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tileops.serving.host_memory import on_huge_pages
from tileops_native_cpu import builders as nb

TAIL, STABLE, MEM_SHARE, GEMM_SHARE, GEMV_SHARE, SILU_MUL_X = 1.5, 1.3, 0.85, 0.90, 0.85, 3.0
BF = torch.bfloat16
EB = 2  # bytes per bfloat16 element


class _Spec:
    def __init__(self, t: torch.Tensor) -> None:
        self.device, self.dtype, self.shape = t.device, t.dtype, tuple(t.shape)


@dataclass
class Case:
    name: str
    kind: str  # "memory" | "gemm" | "gemv" | "mixed" | "small"
    ours: Callable[[], Any]
    eager: Callable[[], Any]
    bytes: float = 0.0
    flops: float = 0.0
    min_x_eager: float = 0.0
    keep: list[Any] = field(default_factory=list)


# set in each child from --small-pages
SMALL_PAGES = False


def placed(t: torch.Tensor) -> torch.Tensor:
    """t where the product keeps such tensors: on huge pages (see the module note)."""
    return t if SMALL_PAGES else on_huge_pages(t)


def randn(*shape: int) -> torch.Tensor:
    return placed(torch.randn(*shape, dtype=BF))


def build(builder, inputs, **params):
    return builder(*(_Spec(t) for t in inputs), **params)


def rotating(make: Callable[[int], tuple[Any, ...]], copies: int) -> Callable[[], tuple[Any, ...]]:
    """Cycles through `copies` input sets, so a case whose inputs would fit in the L3 reads
    them from memory, as a model does that has many layers of them."""
    sets = [make(i) for i in range(copies)]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % copies
        return sets[state["i"]]

    return nxt


def memory_cases() -> list[Case]:
    out: list[Case] = []
    M, N = 8192, 4096  # 64 MiB per bfloat16 tensor: twice the L3
    x, res, w, b = randn(M, N), randn(M, N), randn(N), randn(N)
    k = build(nb.build_rms_norm, [x, w], normalized_shape=(N,), eps=1e-6)
    out.append(
        Case(
            f"RMSNorm [{M},{N}]", "memory", lambda: k(x, w), lambda: F.rms_norm(x, (N,), w, 1e-6), bytes=2 * M * N * EB
        )
    )
    kf = build(nb.build_fused_add_rms_norm, [x, res, w], eps=1e-6)

    def fused_eager():
        s = x + res
        return F.rms_norm(s, (N,), w, 1e-6), s

    out.append(Case(f"FusedAddRMSNorm [{M},{N}]", "memory", lambda: kf(x, res, w), fused_eager, bytes=4 * M * N * EB))
    kl = build(nb.build_layer_norm, [x, w, b], normalized_shape=(N,), eps=1e-5)
    out.append(
        Case(
            f"LayerNorm [{M},{N}]",
            "memory",
            lambda: kl(x, w, b),
            lambda: F.layer_norm(x, (N,), w, b, 1e-5),
            bytes=2 * M * N * EB,
        )
    )
    ks = build(nb.build_softmax, [x], dim=-1)
    out.append(Case(f"Softmax [{M},{N}]", "memory", lambda: ks(x), lambda: torch.softmax(x, -1), bytes=2 * M * N * EB))
    ka = build(nb.build_add, [x, res], alpha=1)
    out.append(Case(f"Add [{M},{N}]", "memory", lambda: ka(x, res), lambda: x + res, bytes=3 * M * N * EB))
    kt = build(nb.build_silu, [x], inplace=False)
    out.append(Case(f"Silu [{M},{N}]", "memory", lambda: kt(x), lambda: F.silu(x), bytes=2 * M * N * EB))
    xg = randn(2048, 8192)
    kg = build(nb.build_silu_and_mul, [xg])

    def silu_mul_eager():
        gate, value = xg.chunk(2, -1)
        return F.silu(gate) * value

    out.append(
        Case(
            "SiluAndMul [2048,8192]",
            "memory",
            lambda: kg(xg),
            silu_mul_eager,
            bytes=3 * 2048 * 4096 * EB,
            min_x_eager=SILU_MUL_X,
        )
    )
    xb = randn(8192, 16384)  # 256 MiB in, 128 MiB out
    kb = build(nb.build_silu_and_mul, [xb])

    def silu_mul_big_eager():
        gate, value = xb.chunk(2, -1)
        return F.silu(gate) * value

    out.append(
        Case("SiluAndMul [8192,16384]", "memory", lambda: kb(xb), silu_mul_big_eager, bytes=3 * 8192 * 8192 * EB)
    )
    xr = randn(8192, 32, 128)
    pos = torch.randint(0, 8192, (8192,))
    kr = build(nb.build_rope_neox_position_ids, [xr, pos], max_position=8192, base=10000.0, rotary_dim=128)
    half = 64
    freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = torch.outer(torch.arange(8192, dtype=torch.float32), freqs)
    cos, sin = ang.cos().to(BF), ang.sin().to(BF)

    def rope_eager():
        c, s = cos[pos][:, None], sin[pos][:, None]
        x1, x2 = xr[..., :half], xr[..., half:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)

    out.append(
        Case("RopeNeoxPositionIds [8192,32,128]", "memory", lambda: kr(xr, pos), rope_eager, bytes=2 * xr.numel() * EB)
    )
    return out


def small_cases() -> list[Case]:
    """Calls of a decode step's size: latency, not bandwidth, is what counts."""
    r = torch.randn
    out: list[Case] = []
    x, w = r(1, 4096, dtype=BF), r(4096, dtype=BF)
    k = build(nb.build_rms_norm, [x, w], normalized_shape=(4096,), eps=1e-6)
    out.append(Case("RMSNorm [1,4096]", "small", lambda: k(x, w), lambda: F.rms_norm(x, (4096,), w, 1e-6)))
    xm, wm = r(64, 4096, dtype=BF), r(4096, dtype=BF)
    km = build(nb.build_rms_norm, [xm, wm], normalized_shape=(4096,), eps=1e-6)
    out.append(Case("RMSNorm [64,4096]", "small", lambda: km(xm, wm), lambda: F.rms_norm(xm, (4096,), wm, 1e-6)))
    xs = r(16, 28672, dtype=BF)
    ks = build(nb.build_silu_and_mul, [xs])

    def silu_mul_eager():
        gate, value = xs.chunk(2, -1)
        return F.silu(gate) * value

    out.append(Case("SiluAndMul [16,28672]", "small", lambda: ks(xs), silu_mul_eager))
    return out


def gemm_cases() -> list[Case]:
    """Prefill GEMMs of examples/llama_step.py's decoder (hidden 1024, MLP 2816, 512 tokens)
    in the F.linear layout, and square NN GEMMs; all compute-bound."""
    out: list[Case] = []
    for label, m, n, k in (("qkv", 512, 1536, 1024), ("gate_up", 512, 5632, 1024), ("down", 512, 1024, 2816)):
        a, b = randn(m, k), placed(torch.randn(n, k, dtype=BF) * 0.02)
        kern = build(nb.build_gemm, [a, b], trans_a=False, trans_b=True)
        out.append(
            Case(
                f"Gemm {label} m{m} n{n} k{k} NT",
                "gemm",
                lambda kern=kern, a=a, b=b: kern(a, b),
                lambda a=a, b=b: F.linear(a, b),
                flops=2 * m * n * k,
            )
        )
    for s in (1024, 2048):
        a, b = randn(s, s), randn(s, s)
        kern = build(nb.build_gemm, [a, b], trans_a=False, trans_b=False)
        out.append(
            Case(
                f"Gemm {s}^3 NN",
                "gemm",
                lambda kern=kern, a=a, b=b: kern(a, b),
                lambda a=a, b=b: torch.matmul(a, b),
                flops=2 * s**3,
            )
        )
    return out


def gemv_cases() -> list[Case]:
    """Decode GEMVs of the same decoder, over enough weight copies (like its layers) that
    the weights come from memory: read-bound on the weight bytes."""
    out: list[Case] = []
    for label, n, k in (("qkv", 1536, 1024), ("o", 1024, 1024), ("gate_up", 5632, 1024), ("down", 1024, 2816)):
        copies = max(2, (96 << 20) // (n * k * EB))
        nxt = rotating(
            lambda i, n=n, k=k: (torch.randn(1, k, dtype=BF), placed(torch.randn(n, k, dtype=BF) * 0.02)), copies
        )
        a0, w0 = nxt()
        kern = build(nb.build_gemm, [a0, w0], trans_a=False, trans_b=True)

        def ours(kern=kern, nxt=nxt):
            a, w = nxt()
            return kern(a, w)

        def eager(nxt=nxt):
            a, w = nxt()
            return F.linear(a, w)

        out.append(Case(f"GEMV {label} 1x{k}->{n} ({copies} weights)", "gemv", ours, eager, bytes=n * k * EB))
    return out


def mixed_cases() -> list[Case]:
    """Two decoder layers as transformers runs them, tileops' norms, RoPE, residual adds and
    gated MLP between torch's F.linear and SDPA, against the same layers in eager."""
    out: list[Case] = []
    hidden, heads, heads_kv, dim, mlp, layers, ctx = 1024, 16, 4, 64, 2816, 2, 256
    g = torch.Generator().manual_seed(0)

    def w(*shape, scale=0.02):
        return placed((torch.randn(*shape, generator=g) * scale).to(BF))

    qkv_n = (heads + 2 * heads_kv) * dim
    ws = [
        dict(
            n1=1 + w(hidden, scale=0.1),
            qkv=w(qkv_n, hidden),
            o=w(hidden, heads * dim),
            n2=1 + w(hidden, scale=0.1),
            gu=w(2 * mlp, hidden),
            down=w(hidden, mlp),
        )
        for _ in range(layers)
    ]
    half = dim // 2
    freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = torch.outer(torch.arange(4096, dtype=torch.float32), freqs)
    cos, sin = ang.cos().to(BF), ang.sin().to(BF)
    for tokens in (1, 64):
        x = torch.randn(tokens, hidden, dtype=BF)
        kcache = [torch.randn(1, heads_kv, ctx + tokens, dim, dtype=BF) for _ in range(layers)]
        vcache = [torch.randn(1, heads_kv, ctx + tokens, dim, dtype=BF) for _ in range(layers)]
        pos = torch.arange(ctx, ctx + tokens)
        norm = build(nb.build_rms_norm, [x, ws[0]["n1"]], normalized_shape=(hidden,), eps=1e-5)
        fused = build(nb.build_fused_add_rms_norm, [x, x, ws[0]["n2"]], eps=1e-5)
        add = build(nb.build_add, [x, x], alpha=1)
        q0 = torch.empty(tokens, heads, dim, dtype=BF)
        k0 = torch.empty(tokens, heads_kv, dim, dtype=BF)
        rope_q = build(nb.build_rope_neox_position_ids, [q0, pos], max_position=4096, base=10000.0, rotary_dim=dim)
        rope_k = build(nb.build_rope_neox_position_ids, [k0, pos], max_position=4096, base=10000.0, rotary_dim=dim)
        gu0 = torch.empty(tokens, 2 * mlp, dtype=BF)
        silu_mul = build(nb.build_silu_and_mul, [gu0])

        def attend(q, k, v, layer, kcache=kcache, vcache=vcache, tokens=tokens):
            kc, vc = kcache[layer], vcache[layer]
            kc[:, :, ctx:] = k.transpose(0, 1)[None]
            vc[:, :, ctx:] = v.transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc, vc, is_causal=tokens > 1, enable_gqa=True)
            return o[0].transpose(0, 1).reshape(tokens, heads * dim)

        def split(t, tokens=tokens):
            q_end, kv_end = heads * dim, (heads + heads_kv) * dim
            return (
                t[:, :q_end].reshape(tokens, heads, dim),
                t[:, q_end:kv_end].reshape(tokens, heads_kv, dim),
                t[:, kv_end:].reshape(tokens, heads_kv, dim),
            )

        def ours(
            x=x,
            norm=norm,
            fused=fused,
            add=add,
            rope_q=rope_q,
            rope_k=rope_k,
            silu_mul=silu_mul,
            pos=pos,
            attend=attend,
            split=split,
        ):
            h = norm(x, ws[0]["n1"])
            for layer, lw in enumerate(ws):
                q, k, v = split(F.linear(h, lw["qkv"]))
                q, k = rope_q(q.contiguous(), pos), rope_k(k.contiguous(), pos)
                o = F.linear(attend(q, k, v, layer), lw["o"])
                h, x = fused(o, x, lw["n2"])
                x = add(x, F.linear(silu_mul(F.linear(h, lw["gu"])), lw["down"]))
                h = norm(x, ws[(layer + 1) % layers]["n1"])
            return x

        def rope_eager(t, pos=pos):
            c, s = cos[pos][:, None], sin[pos][:, None]
            t1, t2 = t[..., :half], t[..., half:]
            return torch.cat((t1 * c - t2 * s, t2 * c + t1 * s), -1)

        def eager(x=x, attend=attend, split=split, rope_eager=rope_eager):
            h = F.rms_norm(x, (hidden,), ws[0]["n1"], 1e-5)
            for layer, lw in enumerate(ws):
                q, k, v = split(F.linear(h, lw["qkv"]))
                q, k = rope_eager(q), rope_eager(k)
                x = x + F.linear(attend(q, k, v, layer), lw["o"])
                h = F.rms_norm(x, (hidden,), lw["n2"], 1e-5)
                gate, up = F.linear(h, lw["gu"]).chunk(2, -1)
                x = x + F.linear(F.silu(gate) * up, lw["down"])
                h = F.rms_norm(x, (hidden,), ws[(layer + 1) % layers]["n1"], 1e-5)
            return x

        out.append(Case(f"mixed loop: {layers} layers, {tokens} token(s)", "mixed", ours, eager))
    return out


def all_cases() -> list[Case]:
    return memory_cases() + small_cases() + gemm_cases() + gemv_cases() + mixed_cases()


def time_calls(fn: Callable[[], Any], calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    clock = time.perf_counter
    times = []
    for _ in range(calls):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


# the bandwidth probes a kind of case is held to: read+write (the better copy probe) or read
CEILING_PROBES = {"memory": ("copy", "copy_stream"), "gemv": ("read",)}


# the probes whose repeats each process reports as the machine's own latency rows
MACHINE_PROBES = ("read", "copy", "copy_stream")


def probe_rates(kinds: tuple[str, ...], threads: int, repeats: int) -> dict[str, list[float]]:
    """Each repeat's GB/s of native_cpu's bandwidth probes `kinds` (256 MiB)."""
    return {kind: nb.native().probe_bandwidth(kind, 256, threads, repeats) for kind in kinds}


def median_and_best(rates: dict[str, list[float]]) -> tuple[float, float]:
    """(the better probe's median, the best repeat of any), GB/s; (0, 0) for no probes."""
    return (
        max((statistics.median(r) for r in rates.values()), default=0.0),
        max((max(r) for r in rates.values()), default=0.0),
    )


def child(args) -> None:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    only = [s for s in args.only.split(",") if s]
    result = {}
    for case in all_cases():
        if only and not any(case.name.startswith(o) for o in only):
            continue
        # each side in a block of its own: eager's bfloat16 norms make GiB of float32
        # temporaries, whose page faults would otherwise land in our figures (the mixed
        # loop is where the two interleave, as they do in a model)
        kinds = CEILING_PROBES.get(case.kind, ())
        before = probe_rates(kinds, threads, 3)
        ours = time_calls(case.ours, args.calls, args.warmup)
        after = probe_rates(kinds, threads, 3)
        ceiling, best = median_and_best({k: before[k] + after[k] for k in kinds})
        eager = time_calls(case.eager, args.calls, args.warmup)
        result[case.name] = dict(
            kind=case.kind,
            bytes=case.bytes,
            flops=case.flops,
            min_x_eager=case.min_x_eager,
            ours=ours,
            eager=eager,
            ceiling=ceiling,
            ceiling_best=best,
        )
        del case
    result["_pool"] = list(nb.native().pool_stats())
    # the machine's own distribution: each probe's repeats as calls (one pass over 256 MiB
    # each), held to the same tail and stability targets as the cases
    result["_machine"] = probe_rates(MACHINE_PROBES, threads, args.calls)
    print("JSON " + json.dumps(result))


def stats(ts: list[float]) -> tuple[float, float, float]:
    s = sorted(ts)
    return statistics.median(s), s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))], s[-1]


def machine(threads: int) -> dict[str, float]:
    C = nb.native()
    m = {}
    # medians, for the header only: the targets use the probes each process runs beside
    # each case
    for kind in MACHINE_PROBES:
        m[kind] = median_and_best(probe_rates((kind,), threads, 9))[0]
    try:
        m["bf16"] = max(C.probe_bf16_peak(threads, 9))
    except ValueError:
        m["bf16"] = float("nan")  # no AVX-512 BF16 build on this CPU
    return m


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=3, help="fresh processes (>= 3 for the stability target)")
    ap.add_argument("--calls", type=int, default=41, help="timed calls per case and process (>= 31)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes")
    ap.add_argument(
        "--thp",
        action="store_true",
        help="children run with THP_MEM_ALLOC_ENABLE=1: torch's allocator asks for huge pages, for "
        "inputs (and eager's outputs) as native_cpu's outputs already have",
    )
    ap.add_argument(
        "--small-pages",
        action="store_true",
        help="inputs and weights on torch's 4 KiB pages, not on huge pages as in a model",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        global SMALL_PAGES
        SMALL_PAGES = args.small_pages
        child(args)
        return 0
    threads = torch.get_num_threads()
    m = machine(threads)
    env = {k: v for k, v in os.environ.items() if k.startswith("TILEOPS_NATIVE_CPU")}
    print(
        f"torch {torch.__version__}, {threads} threads, native_cpu ISA {nb.native().isa()}; {args.procs} fresh "
        f"processes x {args.calls} calls per case"
        + (f"; env {env}" if env else "")
        + ("; inputs and weights on 4 KiB pages" if args.small_pages else "; inputs and weights on huge pages")
        + ("; children with THP_MEM_ALLOC_ENABLE=1" if args.thp else "")
    )
    print(
        f"machine at start ({threads} threads, 256 MiB, medians of 9 repeats): read {m['read']:.1f} GB/s, "
        f"copy {m['copy']:.1f} GB/s, streaming copy {m['copy_stream']:.1f} GB/s (read+write), "
        f"bf16 peak {m['bf16']:.0f} GFLOP/s"
    )
    print(
        "(memory and GEMV shares are of the median of the probes each process ran beside the case; the worst "
        "process's share is the verdict)\n"
    )
    runs = []
    for p in range(args.procs):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            f"--calls={args.calls}",
            f"--warmup={args.warmup}",
            f"--only={args.only}",
        ]
        cmd += ["--small-pages"] * args.small_pages
        child_env = dict(os.environ, THP_MEM_ALLOC_ENABLE="1") if args.thp else None
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("JSON ")), None)
        if proc.returncode != 0 or line is None:
            print(f"process {p + 1} failed (exit status {proc.returncode}):\n{proc.stdout}{proc.stderr}")
            return 1
        runs.append(json.loads(line[5:]))
    names = [n for n in runs[0] if not n.startswith("_")]
    # a case's kind -> what its rate counts, the ceiling it is a share of (None: the probe
    # each process ran beside the case), the share to reach
    limits = {
        "memory": ("bytes", "read+write", None, MEM_SHARE, "GB/s"),
        "gemm": ("flops", "peak", m["bf16"], GEMM_SHARE, "GFLOP/s"),
        "gemv": ("bytes", "read", None, GEMV_SHARE, "GB/s"),
    }
    misses: list[str] = []
    hdr = (
        f"{'case':<40} {'proc':>4} {'tileops ms: median':>18} {'p90':>7} {'max':>7} "
        f"{'eager ms: median':>16} {'p90':>7} {'max':>7} {'x eager':>7}"
    )
    print(hdr)
    print("-" * len(hdr))
    for name in names:
        meds = []
        for p, run in enumerate(runs):
            c = run[name]
            mo, po, xo = stats(c["ours"])
            me, pe, xe = stats(c["eager"])
            meds.append((mo, me))
            tail_ok = po <= TAIL * mo
            if not tail_ok:
                misses.append(f"tail: {name} (process {p + 1}: p90 {po / mo:.2f}x median)")
            print(
                f"{name if p == 0 else '':<40} {p + 1:>4} {mo * 1e3:18.3f} {po * 1e3:7.3f} {xo * 1e3:7.3f} "
                f"{me * 1e3:16.3f} {pe * 1e3:7.3f} {xe * 1e3:7.3f} {me / mo:7.2f}" + ("" if tail_ok else "  tail MISS")
            )
        c = runs[0][name]
        ours_meds, eager_meds = [a for a, _ in meds], [e for _, e in meds]
        spread = max(ours_meds) / min(ours_meds)
        x_eager = min(e / o for o, e in meds)
        # eager's own spread across the same processes: how much of ours is the machine's
        verdicts = [
            f"stability {spread:.2f}x {'ok' if spread <= STABLE else 'MISS'} "
            f"(eager {max(eager_meds) / min(eager_meds):.2f}x)"
        ]
        if spread > STABLE:
            misses.append(f"stability: {name} ({spread:.2f}x)")
        if c["kind"] in limits:
            counted, ceiling_name, fixed, share, unit = limits[c["kind"]]
            # the worst process's share (of its own probes, or of the fixed ceiling)
            rate, ceiling, best = min(
                (
                    (c[counted] / o / 1e9, fixed or run[name]["ceiling"], run[name]["ceiling_best"])
                    for (o, _), run in zip(meds, runs)
                ),
                key=lambda rc: rc[0] / rc[1],
            )
            ok = rate >= share * ceiling
            verdicts.append(
                f"{rate:.1f} {unit} = {rate / ceiling:.0%} of {ceiling_name}"
                + (
                    ""
                    if fixed
                    else f" ({ceiling:.1f} {unit} beside it, {rate / best:.0%} of its best repeat {best:.1f})"
                )
                + f" {'ok' if ok else 'MISS'}"
            )
            if not ok:
                misses.append(f"{c['kind']}: {name} ({rate / ceiling:.0%})")
        if c["min_x_eager"]:
            ok = x_eager >= c["min_x_eager"]
            verdicts.append(f"x eager {x_eager:.2f} (>= {c['min_x_eager']:g}) {'ok' if ok else 'MISS'}")
            if not ok:
                misses.append(f"x eager: {name} ({x_eager:.2f}x)")
        print(f"{'':<40} {'':>4} worst process: " + "; ".join(verdicts))
    print()
    for p, run in enumerate(runs):
        rounds, chunks, caller, on_team, stalls, alone = run["_pool"]
        if rounds:
            print(
                f"process {p + 1}: {rounds} parallel regions, {on_team / rounds:.0%} on torch's OpenMP team, {stalls} "
                f"stalled, {alone} on the calling thread alone after a stall; calling thread ran "
                f"{caller / max(chunks, 1):.0%} of the chunks"
            )
    machine_misses = report_machine(runs)
    print(f"\n{len(misses)} target(s) missed" + ("".join(f"\n  {s}" for s in misses) if misses else ""))
    if machine_misses:
        print(
            f"the machine's own probes missed {len(machine_misses)} of the same targets (a floor no kernel of "
            "ours can pass):" + "".join(f"\n  {s}" for s in machine_misses)
        )
    return 0


def report_machine(runs: list[dict]) -> list[str]:
    """The machine's own rows: each bandwidth probe's repeats in each process, as rates and as
    the tail and stability the cases are held to. Where the probe misses a target, a memory-
    bound case's miss of it says nothing about the kernel. Returns the probes' misses."""
    print("\nthe machine itself: each probe repeat (one pass over 256 MiB) as a call")
    print(f"{'probe':<40} {'proc':>4} {'GB/s: median':>18} {'p90':>7} {'min':>7}")
    misses = []
    for kind in MACHINE_PROBES:
        meds = []
        for p, run in enumerate(runs):
            med, p90, worst = stats([1 / r for r in run["_machine"][kind]])  # seconds per GB
            meds.append(med)
            tail_ok = p90 <= TAIL * med
            if not tail_ok:
                misses.append(f"tail: {kind} probe (process {p + 1}: p90 {p90 / med:.2f}x median)")
            print(
                f"{kind if p == 0 else '':<40} {p + 1:>4} {1 / med:18.1f} {1 / p90:7.1f} {1 / worst:7.1f}"
                + ("" if tail_ok else "  tail MISS")
            )
        spread = max(meds) / min(meds)
        if spread > STABLE:
            misses.append(f"stability: {kind} probe ({spread:.2f}x)")
        print(f"{'':<40} {'':>4} stability {spread:.2f}x {'ok' if spread <= STABLE else 'MISS'}")
    return misses


if __name__ == "__main__":
    sys.exit(main())
