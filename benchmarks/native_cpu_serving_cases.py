"""The MoE block's and the serving attention ops' cases for benchmarks/native_cpu.py (the
others are in native_cpu_cases.py): each adds its cases through ``add``, which takes a
Case's fields."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tileops.serving import huge_page_empty, huge_pages_available
from tileops_native_cpu import builders as nb
from tileops_native_cpu.builders import BUILDERS

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


def moe_cases(add: Callable[..., None]) -> None:
    bf = torch.bfloat16
    E, K, H, Fz = MOE_E, MOE_K, MOE_H, MOE_F
    w_gate_up = torch.randn(E, 2 * Fz, H, dtype=bf) * H**-0.5
    w_down = torch.randn(E, H, Fz, dtype=bf) * Fz**-0.5
    for t in (1, 512):
        logits = torch.randn(t, E)
        add(
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
    params = dict(num_experts=E, top_k=K, hidden_size=H, ffn_size=Fz, renormalize=True)
    for t in (1, 4):
        x, logits = torch.randn(t, H, dtype=bf), torch.randn(t, E)
        chosen = len(set(topk_eager(logits)[1].flatten().tolist()))
        # GB/s of the chosen experts' weights, the only bytes a decode step must read
        add(
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
    t = 512
    x, logits = torch.randn(t, H, dtype=bf), torch.randn(t, E)
    add(
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
