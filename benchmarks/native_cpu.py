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
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from tileops.rope_tables import cos_sin
from tileops.serving import huge_page_empty, huge_pages_available
from tileops_native_cpu import builders as nb
from tileops_native_cpu.builders import BUILDERS


class Spec(NamedTuple):
    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]


def spec(t: torch.Tensor | None) -> Spec | None:
    return None if t is None else Spec(t.device, t.dtype, tuple(t.shape))


@dataclass
class Case:
    op: str
    label: str
    inputs: list[Any]
    eager: Callable[..., Any]
    build: Callable[..., Any]
    params: dict[str, Any] = field(default_factory=dict)
    bytes: float = 0.0  # roofline bytes; 0 for compute-bound cases
    flops: float = 0.0
    target_eager: float = 1.0
    target_compile: float = 1.0
    memory_bound: bool = True
    bandwidth: str = "copy"  # the probe a memory-bound case is shown against: "copy" or "read"


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


# The scaled RoPEs' params, as their 1d and position-id cases take them: Llama 3.1's,
# YaRN's, and LongRoPE's (Phi-3's shape: 64 rescale factors, a 4k context stretched to 128k)
SCALED_ROPES = (
    ("RopeLlama31FwdOp", dict(scale_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)),
    ("RopeYarnFwdOp", dict(scale=16.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0, attn_factor=1.0)),
    (
        "RopeLongRopeFwdOp",
        dict(
            rescale_factors=tuple(1.0 + 15.0 * (k / 63) ** 2 for k in range(64)),
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
        ),
    ),
)


def rope_tables(seq: int, dim: int, dtype: torch.dtype, base: float = 10000.0):
    return cos_sin(torch.arange(seq), dim, base, dtype)


def _scaled_rope_tables(op: str, seq: int, dim: int, params: dict, dtype: torch.dtype):
    scaling = {"RopeLlama31FwdOp": "llama31", "RopeYarnFwdOp": "yarn", "RopeLongRopeFwdOp": "longrope"}[op]
    return cos_sin(torch.arange(seq), dim, 10000.0, dtype, scaling, params)


def rope_eager(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = torch.cat([cos, cos], -1)
    s = torch.cat([sin, sin], -1)
    return x * c + torch.cat([-x2, x1], -1) * s


def rope_pairs_eager(x, cos, sin):
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).flatten(-2)


def cases() -> list[Case]:
    bf, fp = torch.bfloat16, torch.float16
    r = torch.randn
    out: list[Case] = []
    eb = 2

    def add(*a, **k):
        out.append(Case(*a, **k))

    M, N = 2048, 4096
    x, w = r(M, N, dtype=bf), r(N, dtype=bf)
    add(
        "RMSNorm",
        f"[{M},{N}] bf16",
        [x, w],
        lambda x, w: F.rms_norm(x, (N,), w, 1e-6),
        nb.build_rms_norm,
        dict(normalized_shape=(N,), eps=1e-6),
        bytes=(2 * M * N + N) * eb,
        target_eager=3,
    )
    x1, w1 = r(1, N, dtype=bf), w
    add(
        "RMSNorm",
        f"[1,{N}] bf16 (decode)",
        [x1, w1],
        lambda x, w: F.rms_norm(x, (N,), w, 1e-6),
        nb.build_rms_norm,
        dict(normalized_shape=(N,), eps=1e-6),
        bytes=(2 * N + N) * eb,
        target_eager=3,
        memory_bound=False,
    )
    res = r(M, N, dtype=bf)

    def fused_eager(x, res, w):
        s = x + res
        return F.rms_norm(s, (N,), w, 1e-6), s

    add(
        "FusedAddRMSNorm",
        f"[{M},{N}] bf16",
        [x, res, w],
        fused_eager,
        nb.build_fused_add_rms_norm,
        dict(eps=1e-6),
        bytes=(4 * M * N + N) * eb,
        target_eager=3,
    )
    bias = r(N, dtype=bf)

    def fused_ln_eager(x, res, w, b):
        s = x + res
        return F.layer_norm(s, (N,), w, b, 1e-5), s

    add(
        "FusedAddLayerNorm",
        f"[{M},{N}] bf16",
        [x, res, w, bias],
        fused_ln_eager,
        nb.build_fused_add_layer_norm,
        dict(eps=1e-5),
        bytes=(4 * M * N + 2 * N) * eb,
        target_eager=1.5,
    )
    add(
        "LayerNorm",
        f"[{M},{N}] bf16",
        [x, w, bias],
        lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5),
        nb.build_layer_norm,
        dict(normalized_shape=(N,), eps=1e-5),
        bytes=(2 * M * N + 2 * N) * eb,
        target_eager=1.2,
    )
    g = r(8, 128, 32, 32, dtype=bf)
    gw, gb = r(128, dtype=bf), r(128, dtype=bf)
    add(
        "GroupNorm",
        "[8,128,32,32] g32 affine bf16",
        [g, gw, gb],
        lambda x, w, b: F.group_norm(x, 32, w, b, 1e-5),
        nb.build_group_norm,
        dict(num_groups=32, eps=1e-5),
        bytes=(2 * g.numel() + 256) * eb,
    )
    s = r(32, 32, 4096, dtype=bf)
    add(
        "Softmax",
        "[32,32,4096] bf16",
        [s],
        lambda x: torch.softmax(x, -1),
        nb.build_softmax,
        dict(dim=-1),
        bytes=2 * s.numel() * eb,
        target_eager=1.2,
    )
    s32 = r(32, 32, 4096)
    add(
        "Softmax",
        "[32,32,4096] fp32",
        [s32],
        lambda x: torch.softmax(x, -1),
        nb.build_softmax,
        dict(dim=-1),
        bytes=2 * s32.numel() * 4,
        target_eager=1.2,
    )
    lm = r(4, 102400, dtype=bf)
    add(
        "Softmax",
        "[4,102400] bf16",
        [lm],
        lambda x: torch.softmax(x, -1),
        nb.build_softmax,
        dict(dim=-1),
        bytes=2 * lm.numel() * eb,
        target_eager=1.2,
    )
    add(
        "LogSoftmax",
        "[32,32,4096] bf16",
        [s],
        lambda x: torch.log_softmax(x, -1),
        nb.build_log_softmax,
        dict(dim=-1),
        bytes=2 * s.numel() * eb,
    )
    add(
        "Sum",
        f"[{M},{N}] bf16 dim=-1",
        [x],
        lambda x: x.sum(-1),
        nb.build_sum,
        dict(dim=(1,), keepdim=False),
        bytes=(M * N + M) * eb,
    )
    add(
        "Sum",
        f"[{M},{N}] bf16 dim=0",
        [x],
        lambda x: x.sum(0),
        nb.build_sum,
        dict(dim=(0,), keepdim=False),
        bytes=(M * N + N) * eb,
    )
    x3 = r(4, 128, 4096, dtype=fp)
    add(
        "Mean",
        "[4,128,4096] fp16 dim=[0,2]",
        [x3],
        lambda x: x.mean((0, 2)),
        nb.build_mean,
        dict(dim=(0, 2), keepdim=False),
        bytes=(x3.numel() + 128) * eb,
    )
    add(
        "Amax",
        f"[{M},{N}] bf16 dim=-1",
        [x],
        lambda x: x.amax(-1),
        nb.build_amax,
        dict(dim=(1,), keepdim=False),
        bytes=(M * N + M) * eb,
    )
    a, bb = r(1024, 1024, dtype=bf), r(1024, 1024, dtype=bf)
    add(
        "Gemm",
        "1024^3 NN bf16",
        [a, bb],
        lambda a, b: torch.matmul(a, b),
        nb.build_gemm,
        dict(trans_a=False, trans_b=False),
        flops=2 * 1024**3,
        memory_bound=False,
    )
    # torch's fp16 matmul on this CPU takes ~2 s at 1024^3, so this one is smaller
    a16, b16 = r(256, 512, dtype=fp), r(512, 512, dtype=fp)
    add(
        "Gemm",
        "m256 n512 k512 NN fp16",
        [a16, b16],
        lambda a, b: torch.matmul(a, b),
        nb.build_gemm,
        dict(trans_a=False, trans_b=False),
        flops=2 * 256 * 512 * 512,
        memory_bound=False,
    )
    ad, bd = r(128, 7168, dtype=bf), r(2112, 7168, dtype=bf)
    add(
        "Gemm",
        "m128 n2112 k7168 NT bf16",
        [ad, bd],
        lambda a, b: torch.matmul(a, b.T),
        nb.build_gemm,
        dict(trans_a=False, trans_b=True),
        flops=2 * 128 * 2112 * 7168,
        memory_bound=False,
    )
    # decode GEMVs (activation [m, K] x weight [N, K]^T, the F.linear layout): memory-bound
    # on the weight, which is streamed once (its bytes are the roofline)
    for m_, n_, k_ in ((1, 5632, 1024), (1, 2112, 7168), (4, 5632, 1024)):
        av, wv = r(m_, k_, dtype=bf), r(n_, k_, dtype=bf) * 0.02
        add(
            "Gemm",
            f"m{m_} n{n_} k{k_} NT bf16 decode",
            [av, wv],
            lambda a, b: F.linear(a, b),
            nb.build_gemm,
            dict(trans_a=False, trans_b=True),
            bytes=(n_ * k_ + m_ * (k_ + n_)) * eb,
        )
    ba, bb2 = r(64, 128, 128, dtype=bf), r(64, 128, 2048, dtype=bf)
    add(
        "Bmm",
        "b64 m128 n2048 k128 bf16",
        [ba, bb2],
        torch.bmm,
        nb.build_bmm,
        {},
        flops=2 * 64 * 128 * 2048 * 128,
        memory_bound=False,
    )
    y = r(M, N, dtype=bf)
    add(
        "Add",
        f"[{M},{N}] bf16",
        [x, y],
        lambda a, b: torch.add(a, b),
        nb.build_add,
        dict(alpha=1),
        bytes=3 * M * N * eb,
    )
    big, small = r(16, 256, 56, 56, dtype=bf), r(256, 1, 1, dtype=bf)
    add(
        "Add",
        "[16,256,56,56]+[256,1,1] bf16",
        [big, small],
        lambda a, b: torch.add(a, b),
        nb.build_add,
        dict(alpha=1),
        bytes=(2 * big.numel() + 256) * eb,
    )
    add("Mul", f"[{M},{N}] bf16", [x, y], torch.mul, nb.build_mul, {}, bytes=3 * M * N * eb)
    xa = r(512, 14336, dtype=bf)
    add("Silu", "[512,14336] bf16", [xa], F.silu, nb.build_silu, dict(inplace=False), bytes=2 * xa.numel() * eb)
    add("Gelu", "[512,14336] bf16", [xa], F.gelu, nb.build_gelu, dict(approximate="none"), bytes=2 * xa.numel() * eb)
    add("Relu", f"[{M},{N}] bf16", [x], F.relu, nb.build_relu, dict(inplace=False), bytes=2 * M * N * eb)
    xg = r(512, 28672, dtype=bf)

    def silu_mul(x):
        gate, value = x.chunk(2, -1)
        return F.silu(gate) * value

    add(
        "SiluAndMul",
        "[512,28672] bf16",
        [xg],
        silu_mul,
        nb.build_silu_and_mul,
        {},
        bytes=3 * 512 * 14336 * eb,
        target_eager=3,
    )

    def gelu_mul(x):
        gate, value = x.chunk(2, -1)
        return F.gelu(gate) * value

    add(
        "GeluAndMul",
        "[512,28672] bf16",
        [xg],
        gelu_mul,
        BUILDERS["GeluAndMulFwdOp"],
        {},
        bytes=3 * 512 * 14336 * eb,
        target_eager=1.5,
    )

    def gelu_tanh_mul(x):
        gate, value = x.chunk(2, -1)
        return F.gelu(gate, approximate="tanh") * value

    add(
        "GeluTanhAndMul",
        "[512,28672] bf16",
        [xg],
        gelu_tanh_mul,
        BUILDERS["GeluTanhAndMulFwdOp"],
        {},
        bytes=3 * 512 * 14336 * eb,
        target_eager=1.5,
    )
    lo, hi = r(M, N, dtype=bf) - 1, r(M, N, dtype=bf) + 1
    add("Clamp", f"[{M},{N}] bf16 min+max", [x, lo, hi], torch.clamp, nb.build_clamp, {}, bytes=4 * M * N * eb)
    xr = r(4096, 128, dtype=bf)
    c1, s1 = rope_tables(4096, 128, bf)
    add(
        "RopeNeox",
        "1d seq4096 d128 bf16",
        [xr],
        lambda x: rope_eager(x, c1, s1),
        nb.build_rope_neox,
        dict(layout="1d", base=10000.0),
        bytes=(2 * xr.numel() + 4096 * 64 * 2) * eb,
        target_eager=3,
    )
    for op, params in SCALED_ROPES:
        # eager: the same rotation from tables built once, as RopeNeox's eager case does
        cs, sn = _scaled_rope_tables(op, 4096, 128, params, bf)
        add(
            op[:-5],
            "1d seq4096 d128 bf16",
            [xr],
            lambda x, c=cs, s_=sn: rope_eager(x, c, s_),
            BUILDERS[op],
            dict(layout="1d", base=10000.0, **params),
            bytes=(2 * xr.numel() + 4096 * 64 * 2) * eb,
            target_eager=1.5,
        )
    x2 = r(2, 2048, 32, 128, dtype=fp)
    c2, s2 = rope_tables(2048, 128, fp)
    add(
        "RopeNeox",
        "2d [2,2048,32,128] fp16",
        [x2],
        lambda x: rope_eager(x, c2[:, None], s2[:, None]),
        nb.build_rope_neox,
        dict(layout="2d", base=10000.0),
        bytes=(2 * x2.numel() + 2048 * 64 * 2) * eb,
        target_eager=3,
    )
    add(
        "RopeNonNeox",
        "1d seq4096 d128 bf16",
        [xr],
        lambda x: rope_pairs_eager(x, c1, s1),
        BUILDERS["RopeNonNeoxFwdOp"],
        dict(layout="1d", base=10000.0),
        bytes=(2 * xr.numel() + 4096 * 64 * 2) * eb,
        target_eager=1.5,
    )
    x2b = r(2, 2048, 32, 128, dtype=bf)
    c2b, s2b = rope_tables(2048, 128, bf)
    add(
        "RopeNonNeox",
        "2d [2,2048,32,128] bf16",
        [x2b],
        lambda x: rope_pairs_eager(x, c2b[:, None], s2b[:, None]),
        BUILDERS["RopeNonNeoxFwdOp"],
        dict(layout="2d", base=10000.0),
        bytes=(2 * x2b.numel() + 2048 * 64 * 2) * eb,
        target_eager=1.5,
    )
    xp = r(2048, 32, 128, dtype=bf)
    pos = torch.randint(0, 8192, (2048,))
    cp, sp = rope_tables(8192, 128, bf)

    def rope_pos_eager(x, p):
        return rope_eager(x, cp[p][:, None], sp[p][:, None])

    add(
        "RopeNeoxPositionIds",
        "[2048,32,128] bf16",
        [xp, pos],
        rope_pos_eager,
        nb.build_rope_neox_position_ids,
        dict(max_position=8192, base=10000.0, rotary_dim=128),
        bytes=2 * xp.numel() * eb,
        target_eager=3,
    )
    add(
        "RopeNonNeoxPositionIds",
        "[2048,32,128] bf16",
        [xp, pos],
        lambda x, p: rope_pairs_eager(x, cp[p][:, None], sp[p][:, None]),
        BUILDERS["RopeNonNeoxPositionIdsFwdOp"],
        dict(max_position=8192, base=10000.0, rotary_dim=128),
        bytes=2 * xp.numel() * eb,
        target_eager=1.5,
    )
    for op, params in SCALED_ROPES:  # their position-id forms
        cs, sn = _scaled_rope_tables(op, 8192, 128, params, bf)
        name = op.replace("FwdOp", "PositionIdsFwdOp")
        add(
            name[:-5],
            "[2048,32,128] bf16",
            [xp, pos],
            lambda x, p, c=cs, s_=sn: rope_eager(x, c[p][:, None], s_[p][:, None]),
            BUILDERS[name],
            dict(max_position=8192, base=10000.0, rotary_dim=128, **params),
            bytes=2 * xp.numel() * eb,
            target_eager=1.5,
        )
    q, k, v = r(1, 512, 32, 128, dtype=bf), r(1, 512, 8, 128, dtype=bf), r(1, 512, 8, 128, dtype=bf)

    def gqa_eager(q, k, v):
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return o.transpose(1, 2).contiguous()

    add(
        "GQA fwd",
        "q[1,512,32,128] kv8 causal bf16",
        [q, k, v],
        gqa_eager,
        nb.build_gqa,
        dict(is_causal=True),
        flops=4 * 32 * 512 * 512 * 128 / 2,
        memory_bound=False,
    )
    qd, kd, vd = r(8, 32, 128, dtype=bf), r(8, 4096, 8, 128, dtype=bf), r(8, 4096, 8, 128, dtype=bf)

    def decode_eager(q, k, v):
        o = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
        return o[:, :, 0]

    # a decode reads the cache and writes one row a head: shown against the read probe, as
    # the paged decode below
    add(
        "GQA decode",
        "q[8,32,128] kv[8,4096,8,128] bf16",
        [qd, kd, vd],
        decode_eager,
        nb.build_gqa_decode,
        {},
        bytes=(2 * qd.numel() + 2 * kd.numel()) * eb,
        bandwidth="read",
    )
    serving_attention(add)
    out.extend(moe_cases())
    return out


# Qwen3-30B-A3B's MoE layer: 128 experts, 8 per token, hidden 2048, expert FFN 768
# (weights 1.2 GB in bfloat16, far beyond the caches).
MOE_E, MOE_K, MOE_H, MOE_F = 128, 8, 2048, 768


def topk_eager(logits):
    """The router as a model writes it: softmax in float32, topk, renormalise."""
    w, ids = logits.float().softmax(-1).topk(MOE_K, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def moe_eager(x, logits, w_gate_up, w_down):
    """The eager per-expert loop of transformers' Qwen3-MoE block (its experts' forward)."""
    w, ids = topk_eager(logits)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids.long(), MOE_E).permute(2, 1, 0)  # [E, K, T]
    for e in (mask.sum(dim=(-1, -2)) > 0).nonzero()[:, 0].tolist():
        slot, tok = torch.where(mask[e])
        gate, up = F.linear(x[tok], w_gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w_down[e]) * w[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def moe_cases() -> list[Case]:
    bf = torch.bfloat16
    E, K, H, Fz = MOE_E, MOE_K, MOE_H, MOE_F
    w_gate_up = torch.randn(E, 2 * Fz, H, dtype=bf) * H**-0.5
    w_down = torch.randn(E, H, Fz, dtype=bf) * Fz**-0.5
    out = []
    for t in (1, 512):
        logits = torch.randn(t, E)
        out.append(
            Case(
                "FusedTopK",
                f"[{t},{E}] f32 softmax k{K} renorm",
                [logits, None],
                lambda g, b: topk_eager(g),
                nb.build_fused_topk,
                dict(top_k=K, renormalize=True),
                bytes=t * E * 4 + 8 * t * K,
                target_eager=1.5,
                memory_bound=False,
            )
        )
    params = dict(num_experts=E, top_k=K, hidden_size=H, ffn_size=Fz, renormalize=True)
    for t in (1, 4):
        x, logits = torch.randn(t, H, dtype=bf), torch.randn(t, E)
        chosen = len(set(topk_eager(logits)[1].flatten().tolist()))
        # GB/s of the chosen experts' weights, the only bytes a decode step must read
        out.append(
            Case(
                "FusedMoe",
                f"T{t} E{E} k{K} H{H} F{Fz} bf16 ({chosen} experts)",
                [x, logits, w_gate_up, w_down, None],
                lambda x, g, a, b, c: moe_eager(x, g, a, b),
                nb.build_fused_moe,
                dict(params, num_tokens=t),
                bytes=chosen * 3 * Fz * H * 2,
                target_eager=1.5,
                bandwidth="read",
            )
        )
    t = 512
    x, logits = torch.randn(t, H, dtype=bf), torch.randn(t, E)
    out.append(
        Case(
            "FusedMoe",
            f"T{t} E{E} k{K} H{H} F{Fz} bf16",
            [x, logits, w_gate_up, w_down, None],
            lambda x, g, a, b, c: moe_eager(x, g, a, b),
            nb.build_fused_moe,
            dict(params, num_tokens=t),
            flops=6 * t * K * Fz * H,
            target_eager=1.2,
            memory_bound=False,
        )
    )
    return out


def serving_attention(add: Callable[..., None]) -> None:
    """The serving attention ops against what torch users write: SDPA per request (with a
    mask where a window or a chunk needs one) after gathering the pages a block table names."""
    bf, r, i32 = torch.bfloat16, torch.randn, torch.int32
    heads, heads_kv, dim = 32, 8, 128

    def sdpa(q, k, v, mask=None, causal=False):  # q [Lq, H, D], k/v [Lk, Hkv, D]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        return o.transpose(0, 1)

    def band(lq, lk, left, causal=True):  # bottom-right causal with a left window
        i = torch.arange(lq)[:, None] + (lk - lq)
        j = torch.arange(lk)[None]
        return (j <= i if causal else torch.ones(lq, lk, dtype=torch.bool)) & (j >= i - left)

    # packed prefill: four requests of different lengths, causal
    lens = [384, 128, 256, 256]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=i32)
    total = sum(lens)
    q, k, v = r(total, heads, dim, dtype=bf), r(total, heads_kv, dim, dtype=bf), r(total, heads_kv, dim, dtype=bf)
    spans = list(zip(cu[:-1].tolist(), cu[1:].tolist()))

    def varlen_eager(q, k, v, cu_q, cu_k, *_):
        return torch.cat([sdpa(q[a:b], k[a:b], v[a:b], causal=True) for a, b in spans])

    causal_flops = 4 * heads * dim * sum(n * (n + 1) / 2 for n in lens)
    add(
        "GQA prefill varlen",
        f"{lens} H32/8 D128 causal bf16",
        [q, k, v, cu, cu, None, None, None],
        varlen_eager,
        BUILDERS["GroupedQueryAttentionPrefillFwdOp"],
        dict(
            max_seqlen_q=384,
            max_seqlen_kv=384,
            is_causal=True,
            sm_scale=dim**-0.5,
            softcap=0.0,
            window_size_left=-1,
            window_size_right=-1,
        ),
        flops=causal_flops,
        memory_bound=False,
        target_eager=1.5,
    )

    # sliding-window varlen: the same requests, a 128-token left window
    def window_varlen_eager(q, k, v, cu_q, cu_k):
        return torch.cat([sdpa(q[a:b], k[a:b], v[a:b], mask=band(b - a, b - a, 128)) for a, b in spans])

    add(
        "GQA sliding varlen",
        f"{lens} w128 causal bf16",
        [q, k, v, cu, cu],
        window_varlen_eager,
        BUILDERS["GroupedQueryAttentionSlidingWindowVarlenFwdOp"],
        dict(is_causal=True, window_size_left=128, window_size_right=-1, max_seqlen_q=384),
        flops=4 * heads * dim * sum(min(i, 128) + 1 for n in lens for i in range(n)),
        memory_bound=False,
        target_eager=1.5,
    )

    # sliding window over [B, S, H, D]
    qs, ks, vs = (
        r(1, 1024, heads, dim, dtype=bf),
        r(1, 1024, heads_kv, dim, dtype=bf),
        r(1, 1024, heads_kv, dim, dtype=bf),
    )
    mask = band(1024, 1024, 256)

    def window_eager(q, k, v):
        return sdpa(q[0], k[0], v[0], mask=mask)[None]

    add(
        "GQA sliding window",
        "[1,1024,32,128] w256 causal bf16",
        [qs, ks, vs],
        window_eager,
        BUILDERS["GroupedQueryAttentionSlidingWindowFwdOp"],
        dict(is_causal=True, window_size_left=256, window_size_right=-1),
        flops=4 * heads * dim * sum(min(i, 256) + 1 for i in range(1024)),
        memory_bound=False,
        target_eager=1.5,
    )

    # paged decode: 8 sequences of 4096 cached tokens in 64-token pages, shuffled
    batch, n, page = 8, 4096, 64
    width = n // page
    pages = torch.randperm(batch * width).to(i32).reshape(batch, width)
    kc, vc = r(batch * n, heads_kv, dim, dtype=bf), r(batch * n, heads_kv, dim, dtype=bf)
    qd = r(batch, heads, dim, dtype=bf)
    seqlens = torch.full((batch,), n, dtype=i32)

    def rows_of(table, count):  # cache rows of positions 0..count-1 of every request
        return (table[:, :, None].long() * page + torch.arange(page)).reshape(table.shape[0], -1)[:, :count]

    def paged_decode_eager(q, kc, vc, lens_, table):
        rows = rows_of(table, n)
        o = F.scaled_dot_product_attention(
            q[:, :, None], kc[rows].transpose(1, 2), vc[rows].transpose(1, 2), enable_gqa=True
        )
        return o[:, :, 0]

    # and the same cache where PagedKVCache(huge_pages=True) puts it: on 2 MiB pages, as the
    # read probe's buffer is (a 4 KiB page holds two rows of K here)
    caches = [("8 x 4096 tokens p64 bf16", kc, vc)]
    if huge_pages_available():
        kh, vh = huge_page_empty(kc.shape, bf), huge_page_empty(vc.shape, bf)
        kh.copy_(kc), vh.copy_(vc)
        caches.append(("8 x 4096 tokens p64 bf16, huge pages", kh, vh))
    for label, k_cache, v_cache in caches:
        add(
            "GQA decode paged",
            label,
            [qd, k_cache, v_cache, seqlens, pages],
            paged_decode_eager,
            BUILDERS["GroupedQueryAttentionDecodePagedWithKVCacheFwdOp"],
            dict(page_size=page, sm_scale=dim**-0.5, softcap=0.0, window_size_left=-1),
            bytes=(2 * batch * n * heads_kv * dim + 2 * qd.numel()) * 2 + 4 * pages.numel(),
            target_eager=1.5,
            bandwidth="read",
        )

    # paged prefill: a 256-token chunk after 2048 cached tokens (appended, then attended)
    chunk, cached = 256, 2048
    pw = (cached + chunk) // page
    table = torch.randperm(pw).to(i32)[None]
    kp, vp = r(pw * page, heads_kv, dim, dtype=bf), r(pw * page, heads_kv, dim, dtype=bf)
    qc, kn, vn = r(chunk, heads, dim, dtype=bf), r(chunk, heads_kv, dim, dtype=bf), r(chunk, heads_kv, dim, dtype=bf)
    chunk_mask = band(chunk, cached + chunk, 10**9)

    def paged_prefill_eager(q, k_new, v_new, k_pages, v_pages, k_scale, v_scale, cu_q, cache_lens, table_):
        rows = rows_of(table_, cached + chunk)[0]
        k_pages[rows[cached:]] = k_new
        v_pages[rows[cached:]] = v_new
        return sdpa(q, k_pages[rows], v_pages[rows], mask=chunk_mask)

    add(
        "GQA prefill paged",
        f"chunk {chunk} after {cached} p64 bf16",
        [qc, kn, vn, kp, vp, None, None, torch.tensor([0, chunk], dtype=i32), torch.tensor([cached], dtype=i32), table],
        paged_prefill_eager,
        BUILDERS["GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp"],
        dict(max_pages_per_req=pw, page_size=page, max_seqlen_q=chunk, is_causal=True, sm_scale=dim**-0.5, softcap=0.0),
        flops=4 * heads * dim * (chunk * cached + chunk * (chunk + 1) / 2),
        memory_bound=False,
        target_eager=1.5,
    )


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
