"""The cases benchmarks/native_cpu.py times: each op's workload with its eager form, its
builder and params, its roofline bytes or flops and its targets. The norms, softmax,
reductions, RoPE, GEMMs, elementwise ops and GQA decode are here; the MoE block and the
serving attention ops in native_cpu_serving_cases.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from native_cpu_serving_cases import moe_cases, serving_attention

from tileops.rope_tables import cos_sin
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
    moe_cases(add)
    return out
