"""The cases benchmarks/native_latency.py times (its docstring says how, and against which
targets): memory-bound ops beyond the L3, small calls, GEMMs, decode GEMVs and a mixed
decoder-layer loop, each as a tileops call and its torch eager counterpart, on the inputs'
pages the script chooses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tileops.serving.host_memory import on_huge_pages
from tileops_native_cpu import builders as nb

SILU_MUL_X = 3.0  # the silu_mul target: SiluAndMul 2048x8192 >= 3x torch eager by median
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


# set by benchmarks/native_latency.py in each child, from --small-pages
SMALL_PAGES = False


def placed(t: torch.Tensor) -> torch.Tensor:
    """t where the product keeps such tensors: on huge pages (see benchmarks/native_latency.py)."""
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
