"""PagedKVCache: pages come from one pool and go back to it, appended tokens land at the
rows the paged attention ops read (block_table[b, t // page_size] * page_size +
t % page_size), and a call that cannot be served changes nothing."""

from __future__ import annotations

import doctest

import pytest
import torch

import tileops.serving
from tileops.serving import PagedKVCache
from tileops.serving import kv_cache as kv_cache_module

H, D = 2, 8


def tokens(n: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(n, H, D).to(dtype)
    return k, -k  # v differs from k, so a k/v mix-up shows


def cache(num_pages: int = 8, page_size: int = 4, **kw) -> PagedKVCache:
    return PagedKVCache(num_pages, page_size, H, D, **kw)


def test_the_pages_are_one_flat_tensor_each_for_k_and_v():
    c = cache(num_pages=5, page_size=16, dtype=torch.float16)
    assert c.k_pages.shape == c.v_pages.shape == (5 * 16, H, D)
    assert c.k_pages.dtype == torch.float16 and c.k_pages.data_ptr() != c.v_pages.data_ptr()
    assert c.num_free_pages == 5 and c.max_pages_per_seq == 5 and c.max_seqlen == 80


def test_pages_are_handed_out_lowest_first_and_a_freed_sequences_pages_are_reused():
    c = cache(num_pages=6, page_size=4)
    a, b = c.add_sequence(), c.add_sequence()
    c.reserve(a, 9)  # 3 pages
    c.reserve(b, 4)  # 1 page
    assert c.pages(a) == (0, 1, 2) and c.pages(b) == (3,) and c.num_free_pages == 2
    c.free(a)
    assert c.num_free_pages == 5 and c.sequences == (b,)
    d = c.add_sequence()
    assert d not in (a, b)  # ids are never reused
    c.reserve(d, 12)
    assert c.pages(d) == (0, 1, 2)


def test_reserve_allocates_only_what_the_last_page_cannot_hold():
    c = cache(page_size=4)
    s = c.add_sequence()
    c.append(s, *tokens(3))
    c.reserve(s, 1)
    assert len(c.pages(s)) == 1
    c.reserve(s, 2)
    assert len(c.pages(s)) == 2
    c.reserve(s, 0)
    assert len(c.pages(s)) == 2 and c.seqlen(s) == 3  # reserving writes no tokens


@pytest.mark.parametrize("page_size", [1, 16])
def test_appends_across_page_boundaries_gather_back_what_was_appended(page_size):
    c = cache(num_pages=128, page_size=page_size)
    a, b = c.add_sequence(), c.add_sequence()
    written = {a: [], b: []}
    for step, (na, nb) in enumerate([(5, 17), (1, 1), (16, 0), (11, 33), (1, 2)]):
        ka, va = tokens(na)
        kb, vb = tokens(nb)
        how = dict(counts=[na, nb]) if step % 2 else dict(cu_seqlens=PagedKVCache.cu_seqlens([na, nb]))
        c.append([a, b], torch.cat([ka, kb]), torch.cat([va, vb]), **how)
        written[a].append((ka, va))
        written[b].append((kb, vb))
    for s in (a, b):
        k, v = c.gather(s)
        assert torch.equal(k, torch.cat([kk for kk, _ in written[s]]))
        assert torch.equal(v, torch.cat([vv for _, vv in written[s]]))
    assert c.seqlens([a, b]).tolist() == [34, 53]


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_every_stored_token_is_at_the_row_its_block_table_names(page_size):
    c = cache(num_pages=100, page_size=page_size)
    ids = [c.add_sequence() for _ in range(3)]
    c.add_sequence()  # an empty one interleaves nothing
    counts = [7, 20, 1]
    for _ in range(3):  # interleaved appends scatter each sequence over the pool
        k, v = tokens(sum(counts))
        c.append(ids, k, v, counts=counts)
    table, lens = c.block_table(ids), c.seqlens(ids)
    assert table.dtype == lens.dtype == torch.int32
    for b, s in enumerate(ids):
        k, v = c.gather(s)
        for t in range(int(lens[b])):
            row = int(table[b, t // page_size]) * page_size + t % page_size
            assert torch.equal(c.k_pages[row], k[t]) and torch.equal(c.v_pages[row], v[t])


def test_block_table_pads_with_page_zero_and_can_be_cut_to_the_longest_sequence():
    c = cache(num_pages=8, page_size=4)
    a, b = c.add_sequence(), c.add_sequence()
    c.append([a, b], *tokens(2 + 9), counts=[2, 9])
    table = c.block_table([a, b])
    assert table.shape == (2, 8)
    assert table[0].tolist() == [0] + [0] * 7 and table[1, :3].tolist() == [1, 2, 3]
    assert ((table >= 0) & (table < c.num_pages)).all()  # every entry is a valid page
    assert c.block_table([b, a], max_pages=3).tolist() == [[1, 2, 3], [0, 0, 0]]
    with pytest.raises(ValueError, match="holds 3 pages, more than max_pages=2"):
        c.block_table([b], max_pages=2)


def test_cu_seqlens_are_int32_prefix_sums():
    cu = PagedKVCache.cu_seqlens([3, 0, 5])
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 3, 8]
    assert PagedKVCache.cu_seqlens(torch.tensor([2, 2])).tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="int >= 0, got -1"):
        PagedKVCache.cu_seqlens([1, -1])


def test_an_exhausted_pool_raises_and_allocates_nothing():
    c = cache(num_pages=3, page_size=4)
    a, b = c.add_sequence(), c.add_sequence()
    c.append(a, *tokens(8))
    with pytest.raises(RuntimeError, match="exhausted: 3 more pages needed, 1 of 3 free"):
        c.append([a, b], *tokens(1 + 5), counts=[1, 5])
    assert c.num_free_pages == 1 and c.pages(b) == () and c.seqlens([a, b]).tolist() == [8, 0]
    with pytest.raises(RuntimeError, match="exhausted"):
        c.reserve(b, 5)
    c.free(a)
    c.append(b, *tokens(12))  # room again
    assert c.seqlen(b) == 12


def test_a_sequence_past_max_pages_per_seq_raises_value_error():
    c = cache(num_pages=10, page_size=4, max_pages_per_seq=2)
    s = c.add_sequence()
    c.append(s, *tokens(6))
    with pytest.raises(ValueError, match=r"would hold 9 tokens \(6 \+ 3\).*max_pages_per_seq=2.*8 tokens"):
        c.append(s, *tokens(3))
    assert c.seqlen(s) == 6 and len(c.pages(s)) == 2


def z(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize(
    "k, v, kw, error, message",
    [
        (z(4, H + 1, D), None, {}, ValueError, r"k must be \[total_new, 2, 8\], got shape \(4, 3, 8\)"),
        (z(4, H * D), None, {}, ValueError, r"got shape \(4, 16\)"),
        (z(4, H, D, dtype=torch.float32), None, {}, ValueError, "must be torch.bfloat16 .*got torch.float32"),
        (z(4, H, D), z(5, H, D), {}, ValueError, r"v must have k's shape \(4, 2, 8\), got \(5, 2, 8\)"),
        (z(4, H, D), None, {"counts": [1, 2]}, ValueError, "add up to 3 tokens, but k and v have 4 rows"),
        (z(4, H, D), None, {"counts": [4]}, ValueError, r"one entry per sequence \(2\), got 1"),
        (z(4, H, D), None, {"cu_seqlens": [0, 3]}, ValueError, "cu_seqlens must be 3 non-decreasing"),
        (z(4, H, D), None, {}, TypeError, "2 sequences need counts= or cu_seqlens="),
        (z(4, H, D), None, {"counts": [2, 2], "cu_seqlens": [0, 2, 4]}, TypeError, "not both"),
        ([[0.0]], None, {"counts": [1, 0]}, TypeError, "k must be a tensor"),
    ],
)
def test_append_refuses_bad_tokens_naming_what_it_expected_and_writes_nothing(k, v, kw, error, message):
    c = cache()
    a, b = c.add_sequence(), c.add_sequence()
    with pytest.raises(error, match=message):
        c.append([a, b], k, k if v is None else v, **kw)
    assert c.seqlens([a, b]).tolist() == [0, 0] and c.num_free_pages == 8


def test_append_refuses_a_repeated_or_unknown_sequence():
    c = cache()
    a = c.add_sequence()
    with pytest.raises(ValueError, match="distinct"):
        c.append([a, a], *tokens(2), counts=[1, 1])
    with pytest.raises(KeyError, match="no sequence 7"):
        c.append([7], *tokens(1))
    c.free(a)
    with pytest.raises(KeyError, match=f"no sequence {a}"):
        c.seqlen(a)


def test_append_refuses_tokens_on_another_device():
    c = cache()
    s = c.add_sequence()
    k = torch.zeros(1, H, D, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="must be on cpu .*got meta"):
        c.append(s, k, k)


@pytest.mark.parametrize("arg", ["num_pages", "page_size", "heads_kv", "head_dim", "max_pages_per_seq"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_the_constructor_wants_positive_ints(arg, bad):
    args = dict(num_pages=4, page_size=4, heads_kv=H, head_dim=D, max_pages_per_seq=None)
    args[arg] = bad
    with pytest.raises(ValueError, match=f"{arg} must be a positive int, got {bad!r}"):
        PagedKVCache(**args)


def test_the_class_docstring_example_runs():
    failures, _ = doctest.testmod(kv_cache_module)
    assert failures == 0


def test_importing_tileops_does_not_import_the_serving_package():
    import subprocess
    import sys

    code = "import sys, tileops; print('tileops.serving' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    assert tileops.serving.PagedKVCache is PagedKVCache


def test_advance_records_tokens_an_op_wrote_into_reserved_pages():
    cache = PagedKVCache(num_pages=4, page_size=4, heads_kv=1, head_dim=2)
    s = cache.add_sequence()
    cache.reserve(s, 6)  # two pages
    cache.advance(s, [6])
    assert cache.seqlen(s) == 6 and cache.rows(s).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="room for 2 more tokens"):
        cache.advance(s, [3])
    assert cache.seqlen(s) == 6


def test_grow_keeps_every_sequence_and_hands_out_the_new_pages_after_the_old():
    c = cache(num_pages=2, page_size=4, max_pages_per_seq=8)
    a, b = c.add_sequence(), c.add_sequence()
    k, v = tokens(6)
    c.append([a, b], k, v, counts=[3, 3])
    table = c.block_table([a, b])
    with pytest.raises(RuntimeError, match="exhausted"):
        c.append([a], *tokens(8))
    c.grow(5)
    assert c.num_pages == 5 and c.num_free_pages == 3 and c.k_pages.shape[0] == 20
    assert torch.equal(c.block_table([a, b]), table)
    assert torch.equal(c.gather(a)[0], k[:3]) and torch.equal(c.gather(b)[1], v[3:])
    more = tokens(2)
    c.append([a], *more)  # a's last page has room for one; the next page is the first new one
    assert c.pages(a) == (0, 2) and torch.equal(c.gather(a)[0], torch.cat([k[:3], more[0]]))
    with pytest.raises(ValueError, match="fewer"):
        c.grow(4)


def test_a_cache_of_several_layers_shares_one_page_table_and_keeps_each_layers_tokens():
    c = cache(num_pages=2, page_size=4, num_layers=3)
    a, b = c.add_sequence(), c.add_sequence()
    k = torch.randn(3, 2 + 3, H, D).bfloat16()  # every layer's new tokens: 2 of a, 3 of b
    c.append([a, b], k, -k, counts=[2, 3])
    assert c.seqlens([a, b]).tolist() == [2, 3] and c.num_free_pages == 0
    c.grow(4)  # every layer's pools, one page table
    assert all(t.shape[0] == 16 for t in c.k_layers + c.v_layers)
    c.append([a, b], k[:, :2], -k[:, :2], counts=[1, 1])
    for i in range(3):
        keys, values = c.gather(b, layer=i)
        want = torch.cat([k[i, 2:5], k[i, 1:2]])
        assert torch.equal(keys, want) and torch.equal(values, -want)
    assert c.k_pages is c.layer(0)[0] and c.layer(2)[1] is c.v_layers[2]
    with pytest.raises(IndexError, match=r"layer must be an int in \[0, 3\), got 3"):
        c.layer(3)
    with pytest.raises(ValueError, match=r"k must be \[3, total_new, 2, 8\], got shape \(2, 2, 8\)"):
        c.append([a, b], k[0, :2], k[0, :2], counts=[1, 1])


def test_reserve_takes_many_sequences_at_once_and_says_whether_pages_changed():
    c = cache(num_pages=4, page_size=4)
    a, b = c.add_sequence(), c.add_sequence()
    assert c.reserve([a, b], [3, 5]) is True  # 1 + 2 pages
    assert c.pages(a) == (0,) and c.pages(b) == (1, 2)
    c.advance([a, b], [3, 5])
    assert c.reserve([a, b], [1, 1]) is False  # both last pages have room
    assert c.pages_needed([a, b], [2, 4]) == 2 and c.num_free_pages == 1  # asking takes nothing
    with pytest.raises(RuntimeError, match="exhausted: 2 more pages needed, 1 of 4 free"):
        c.reserve([a, b], [2, 4])
    assert c.pages(a) == (0,) and c.pages(b) == (1, 2)  # all or nothing
    with pytest.raises(ValueError, match="2 sequences but 1 counts"):
        c.reserve([a, b], [1])
