"""Serving attention: packed requests and paged caches, beyond the conformance harness.

The harness checks every op against its reference on the manifest's workloads; these
tests pin what serving relies on: a paged cache read through its block table is the same
cache laid out densely, chunked prefill into pages equals one prefill of the whole
sequence, windows wider than a sequence change nothing, each query is masked by its own
key span (causal, windows, softcap), requests that see no key get zeros, and a kernel
called directly refuses an index that would read outside a tensor.
"""

from __future__ import annotations

import pytest
import torch

from conftest import HALVES, close, run
from tileops_native_cpu import builders as b

B = b.BUILDERS
DECODE = B["GroupedQueryAttentionDecodeWithKVCacheFwdOp"]
PAGED_DECODE = B["GroupedQueryAttentionDecodePagedWithKVCacheFwdOp"]
PAGED_PREFILL = B["GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp"]
VARLEN = B["GroupedQueryAttentionPrefillFwdOp"]
WINDOW_VARLEN = B["GroupedQueryAttentionSlidingWindowVarlenFwdOp"]
I32 = torch.int32


def scatter_into_pages(k: list[torch.Tensor], page_size: int, pages: int, width: int, gen: torch.Generator):
    """Each request's keys [L, Hkv, D] into a shared cache of `pages` pages, in shuffled
    pages; unused table entries hold -1, which a kernel must never read."""
    heads_kv, dim = k[0].shape[1:]
    cache = torch.randn(pages * page_size, heads_kv, dim).to(k[0].dtype)
    table = torch.full((len(k), width), -1, dtype=I32)
    free = torch.randperm(pages, generator=gen).tolist()
    for r, keys in enumerate(k):
        for p in range(-(-keys.shape[0] // page_size)):
            page = free.pop()
            table[r, p] = page
            rows = keys[p * page_size : (p + 1) * page_size]
            cache[page * page_size : page * page_size + rows.shape[0]] = rows
    return cache, table


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_decode_is_dense_decode_of_each_gathered_cache(dtype, page_size):
    gen = torch.Generator().manual_seed(1)
    lengths, heads, heads_kv, dim = [1, 37, 130, 64], 8, 2, 64
    k = [torch.randn(n, heads_kv, dim).to(dtype) for n in lengths]
    v = [torch.randn(n, heads_kv, dim).to(dtype) for n in lengths]
    width = -(-max(lengths) // page_size) + 1
    pages = sum(-(-n // page_size) for n in lengths) + 2
    k_cache, table = scatter_into_pages(k, page_size, pages, width, gen)
    v_cache, _ = scatter_into_pages(v, page_size, pages, width, torch.Generator().manual_seed(1))
    q = torch.randn(len(lengths), heads, dim).to(dtype)
    out = run(
        PAGED_DECODE,
        q,
        k_cache,
        v_cache,
        torch.tensor(lengths, dtype=I32),
        table,
        page_size=page_size,
        sm_scale=dim**-0.5,
        softcap=0.0,
        window_size_left=-1,
    )
    for r in range(len(lengths)):
        dense = run(DECODE, q[r : r + 1], k[r][None], v[r][None])
        close(out[r : r + 1], dense)


def test_a_decode_window_keeps_the_last_tokens_and_a_wide_one_keeps_all():
    gen = torch.Generator().manual_seed(2)
    n, page_size = 50, 8
    k, v = torch.randn(1, n, 2, 32).bfloat16(), torch.randn(1, n, 2, 32).bfloat16()
    k_cache, table = scatter_into_pages([k[0]], page_size, 8, 8, gen)
    v_cache, _ = scatter_into_pages([v[0]], page_size, 8, 8, torch.Generator().manual_seed(2))
    q = torch.randn(1, 4, 32).bfloat16()
    lens = torch.tensor([n], dtype=I32)

    def decode(window: int) -> torch.Tensor:
        return run(
            PAGED_DECODE,
            q,
            k_cache,
            v_cache,
            lens,
            table,
            page_size=page_size,
            sm_scale=32**-0.5,
            softcap=0.0,
            window_size_left=window,
        )

    close(decode(10**6), run(DECODE, q, k, v))
    close(decode(n - 1), run(DECODE, q, k, v))
    close(decode(9), run(DECODE, q, k[:, -10:], v[:, -10:]))
    # window 0: the query sees its own token only, so the output is that token's value
    close(decode(0), v[0, -1].repeat_interleave(2, dim=0)[None])


@pytest.mark.parametrize("dtype", HALVES)
def test_chunked_prefill_into_pages_equals_one_prefill_of_the_whole_sequence(dtype):
    gen = torch.Generator().manual_seed(3)
    heads, heads_kv, dim, page_size, n = 4, 2, 32, 16, 70
    q, k, v = (torch.randn(n, h, dim).to(dtype) for h in (heads, heads_kv, heads_kv))
    whole = run(
        VARLEN,
        q,
        k,
        v,
        torch.tensor([0, n], dtype=I32),
        torch.tensor([0, n], dtype=I32),
        None,
        None,
        None,
        max_seqlen_q=n,
        max_seqlen_kv=n,
        is_causal=True,
        sm_scale=dim**-0.5,
        softcap=0.0,
        window_size_left=-1,
        window_size_right=-1,
    )
    pages, width = 8, 6
    k_pages, v_pages = (
        torch.zeros(pages * page_size, heads_kv, dim, dtype=dtype),
        torch.zeros(pages * page_size, heads_kv, dim, dtype=dtype),
    )
    table = torch.tensor([torch.randperm(pages, generator=gen)[:width].tolist()], dtype=I32)
    before = k_pages.clone()
    outs = []
    for start, stop in ((0, 25), (25, 26), (26, n)):  # a chunk, a single token, the rest
        chunk = slice(start, stop)
        outs.append(
            run(
                PAGED_PREFILL,
                q[chunk],
                k[chunk],
                v[chunk],
                k_pages,
                v_pages,
                None,
                None,
                torch.tensor([0, stop - start], dtype=I32),
                torch.tensor([start], dtype=I32),
                table,
                max_pages_per_req=width,
                page_size=page_size,
                max_seqlen_q=stop - start,
                is_causal=True,
                sm_scale=dim**-0.5,
                softcap=0.0,
            )
        )
    close(torch.cat(outs), whole)
    rows = torch.tensor([int(table[0, t // page_size]) * page_size + t % page_size for t in range(n)])
    assert torch.equal(k_pages[rows], k) and torch.equal(v_pages[rows], v)  # appended where the table says
    untouched = torch.ones(len(k_pages), dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(k_pages[untouched], before[untouched])


def test_a_window_wider_than_every_request_is_no_window():
    heads, heads_kv, dim = 4, 4, 16
    cu = torch.tensor([0, 5, 5, 40], dtype=I32)  # an empty request in the middle
    q, k, v = (torch.randn(40, h, dim).bfloat16() for h in (heads, heads_kv, heads_kv))

    def varlen(left: int, right: int, causal: bool) -> torch.Tensor:
        return run(
            VARLEN,
            q,
            k,
            v,
            cu,
            cu,
            None,
            None,
            None,
            max_seqlen_q=35,
            max_seqlen_kv=35,
            is_causal=causal,
            sm_scale=dim**-0.5,
            softcap=0.0,
            window_size_left=left,
            window_size_right=right,
        )

    for causal in (True, False):
        close(varlen(1000, 1000, causal), varlen(-1, -1, causal))
        close(varlen(34, 34, causal), varlen(-1, -1, causal))


def masked_reference(q, k, v, causal, left, right, scale, softcap):
    """One request in float: query i sits on key diagonal i + Lk - Lq; a query that sees no
    key gets zeros."""
    lq, lk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
    s = q.float().transpose(0, 1) @ kf.transpose(1, 2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    diag = torch.arange(lq)[:, None] + lk - lq
    j = torch.arange(lk)[None]
    seen = j <= diag if causal else (j <= diag + right if right >= 0 else torch.ones(lq, lk, dtype=torch.bool))
    if left >= 0:
        seen = seen & (j >= diag - left)
    p = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1).nan_to_num(0.0)
    return (p @ vf).transpose(0, 1)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(
    ("lq", "lk", "causal", "left", "right", "softcap"),
    [
        (70, 70, True, -1, -1, 0.0),  # blocks of 32 queries: the last has 6
        (45, 130, True, 20, -1, 30.0),  # queries after a cache, a left window, softcap
        (37, 37, False, 5, 3, 0.0),  # a band around the diagonal
        (20, 3, True, -1, -1, 0.0),  # most queries see no key
    ],
)
def test_prefill_masks_each_query_by_its_own_key_span(dtype, lq, lk, causal, left, right, softcap):
    # 3 query heads a KV head: groups of rows straddle the heads of one block of queries
    heads, heads_kv, dim = 6, 2, 40
    gen = torch.Generator().manual_seed(lq + lk)
    q, k, v = (
        torch.randn(n, h, dim, generator=gen).to(dtype) for n, h in ((lq, heads), (lk, heads_kv), (lk, heads_kv))
    )
    out = run(
        VARLEN,
        q,
        k,
        v,
        torch.tensor([0, lq], dtype=I32),
        torch.tensor([0, lk], dtype=I32),
        None,
        None,
        None,
        max_seqlen_q=lq,
        max_seqlen_kv=lk,
        is_causal=causal,
        sm_scale=dim**-0.5,
        softcap=softcap,
        window_size_left=left,
        window_size_right=right,
    )
    close(out, masked_reference(q, k, v, causal, left, right, dim**-0.5, softcap).to(dtype), scale=3)


@pytest.mark.parametrize("dtype", HALVES)
def test_queries_that_see_no_key_and_padding_rows_get_zeros(dtype):
    dim = 16
    q, k, v = (torch.randn(n, 2, dim).to(dtype) for n in (12, 4, 4))
    # request 0: 6 queries over 2 keys, causal bottom-right: queries 0..3 see nothing
    out = run(
        VARLEN,
        q[:6],
        k[:2],
        v[:2],
        torch.tensor([0, 6], dtype=I32),
        torch.tensor([0, 2], dtype=I32),
        None,
        None,
        None,
        max_seqlen_q=6,
        max_seqlen_kv=6,
        is_causal=True,
        sm_scale=dim**-0.5,
        softcap=0.0,
        window_size_left=-1,
        window_size_right=-1,
    )
    assert torch.equal(out[:4], torch.zeros_like(out[:4])) and bool(out[4:].abs().sum() > 0)
    # rows past cu_seqlens_q[-1] are padding
    padded = run(
        WINDOW_VARLEN,
        q,
        k,
        v,
        torch.tensor([0, 3, 9], dtype=I32),
        torch.tensor([0, 2, 4], dtype=I32),
        is_causal=False,
        window_size_left=-1,
        window_size_right=-1,
        max_seqlen_q=6,
    )
    assert torch.equal(padded[9:], torch.zeros_like(padded[9:])) and bool(padded[:9].abs().sum() > 0)
    # a request with no cached token at all decodes to zeros
    decoded = run(
        PAGED_DECODE,
        q[:2],
        k,
        v,
        torch.tensor([0, 4], dtype=I32),
        torch.tensor([[0], [0]], dtype=I32),
        page_size=4,
        sm_scale=dim**-0.5,
        softcap=0.0,
        window_size_left=-1,
    )
    assert torch.equal(decoded[0], torch.zeros_like(decoded[0])) and bool(decoded[1].abs().sum() > 0)


@pytest.mark.parametrize(
    ("lengths", "table", "words"),
    [
        ([5, 3], [[0, 1], [7, 0]], r"block_table\[1, 0\] = 7 points outside the cache's 4 pages"),
        ([5, 3], [[0, -1], [2, 0]], r"block_table\[0, 1\] = -1 points outside"),
        ([9, 3], [[0, 1], [2, 3]], "request 0 has 9 tokens; its block_table row holds 8"),
        ([-1, 3], [[0, 1], [2, 3]], "negative length -1"),
    ],
)
def test_a_paged_kernel_called_directly_refuses_indices_outside_its_cache(lengths, table, words):
    q, k = torch.randn(2, 4, 8).bfloat16(), torch.randn(16, 2, 8).bfloat16()
    lens, bt = torch.tensor(lengths, dtype=I32), torch.tensor(table, dtype=I32)
    with pytest.raises(ValueError, match=words):
        run(PAGED_DECODE, q, k, k, lens, bt, page_size=4, sm_scale=8**-0.5, softcap=0.0, window_size_left=-1)


def test_a_varlen_kernel_called_directly_refuses_offsets_that_decrease_or_overrun():
    q = torch.randn(8, 2, 8).half()
    for cu, words in (([0, 5, 3, 8], "offsets must not decrease"), ([0, 4, 9], r"cu_seqlens_q\[2\] = 9, expected 8")):
        offsets = torch.tensor(cu, dtype=I32)
        with pytest.raises(ValueError, match=words):
            run(
                VARLEN,
                q,
                q,
                q,
                offsets,
                offsets,
                None,
                None,
                None,
                max_seqlen_q=8,
                max_seqlen_kv=8,
                is_causal=True,
                sm_scale=0.3,
                softcap=0.0,
                window_size_left=-1,
                window_size_right=-1,
            )


def test_the_paged_prefill_op_refuses_requests_appending_to_one_cache_row_before_writing_any():
    ops = pytest.importorskip("tileops.ops")
    heads, heads_kv, dim, page = 4, 2, 16, 4
    k_pages, v_pages = torch.zeros(4 * page, heads_kv, dim).bfloat16(), torch.zeros(4 * page, heads_kv, dim).bfloat16()
    q, k_new = torch.randn(4, heads, dim).bfloat16(), torch.randn(4, heads_kv, dim).bfloat16()
    cu, cached = torch.tensor([0, 2, 4], dtype=I32), torch.tensor([0, 0], dtype=I32)
    op = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(2, page, 2, target="native_cpu")
    shared = torch.tensor([[1, 2], [1, 3]], dtype=I32)
    with pytest.raises(
        ValueError,
        match=r"writes_apart.* does not hold: request 1's position 0 \(block_table\[1, 0\] = 1\) "
        r"writes cache row 4, which request 0's position 0 \(block_table\[0, 0\] = 1\) writes too",
    ):
        op(q, k_new, k_new, k_pages, v_pages, None, None, cu, cached, shared)
    assert not k_pages.any() and not v_pages.any()  # refused before the append
    out = op(q, k_new, k_new, k_pages, v_pages, None, None, cu, cached, torch.tensor([[1, 2], [0, 3]], dtype=I32))
    assert torch.equal(k_pages[4:6], k_new[:2]) and torch.equal(k_pages[0:2], k_new[2:]) and out.shape == q.shape


def test_a_serving_loop_on_the_paged_kv_cache_helper():
    """Prefill two prompts in chunks into tileops.serving.PagedKVCache with the paged
    prefill op, then decode a few tokens with the paged decode op: every output equals
    dense attention over what the cache gathers for that sequence."""
    serving = pytest.importorskip("tileops.serving", reason="tileops is not importable here")
    ops = pytest.importorskip("tileops.ops")
    heads, heads_kv, dim, page = 4, 2, 32, 8
    cache = serving.PagedKVCache(num_pages=32, page_size=page, heads_kv=heads_kv, head_dim=dim, max_pages_per_seq=12)
    seqs = [cache.add_sequence(), cache.add_sequence()]
    prefill = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(12, page, 64, target="native_cpu")
    decode = ops.GroupedQueryAttentionDecodePagedWithKVCacheFwdOp(page, target="native_cpu")
    seen_k = {s: [] for s in seqs}
    for counts in ([13, 30], [20, 1]):  # two chunks per prompt, uneven
        total = sum(counts)
        q, k, v = (torch.randn(total, h, dim).bfloat16() for h in (heads, heads_kv, heads_kv))
        for s, n in zip(seqs, counts):
            cache.reserve(s, n)
        before = cache.seqlens(seqs)
        out = prefill(
            q, k, v, cache.k_pages, cache.v_pages, None, None, cache.cu_seqlens(counts), before, cache.block_table(seqs)
        )
        cache.advance(seqs, counts)
        at = 0
        for s, n in zip(seqs, counts):
            seen_k[s].append(k[at : at + n])
            keys, values = cache.gather(s)
            cached = int(before[seqs.index(s)])
            want = run(
                VARLEN,
                q[at : at + n],
                keys,
                values,
                torch.tensor([0, n], dtype=I32),
                torch.tensor([0, cached + n], dtype=I32),
                None,
                None,
                None,
                max_seqlen_q=n,
                max_seqlen_kv=cached + n,
                is_causal=True,
                sm_scale=dim**-0.5,
                softcap=0.0,
                window_size_left=-1,
                window_size_right=-1,
            )
            close(out[at : at + n], want)
            at += n
    for s in seqs:
        assert torch.equal(cache.gather(s)[0], torch.cat(seen_k[s]))
    for _ in range(3):  # decode: append one token per sequence, attend over everything cached
        q, k, v = (
            torch.randn(2, heads, dim).bfloat16(),
            torch.randn(2, heads_kv, dim).bfloat16(),
            torch.randn(2, heads_kv, dim).bfloat16(),
        )
        cache.append(seqs, k, v, counts=[1, 1])
        out = decode(q, cache.k_pages, cache.v_pages, cache.seqlens(seqs), cache.block_table(seqs))
        for i, s in enumerate(seqs):
            keys, values = cache.gather(s)
            close(out[i : i + 1], run(DECODE, q[i : i + 1], keys[None], values[None]))
