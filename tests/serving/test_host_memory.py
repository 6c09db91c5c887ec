"""Host tensors on huge pages: 2 MiB-aligned, zero-filled anonymous memory that lives as
long as a tensor views it, refused clearly where the machine has no transparent huge
pages; a PagedKVCache asked for them keeps its pools there through a growth."""

from __future__ import annotations

import gc

import pytest
import torch

from tileops.serving import PagedKVCache, host_memory
from tileops.serving.host_memory import HUGE_PAGE, huge_page_empty, huge_pages_available

needs_thp = pytest.mark.skipif(not huge_pages_available(), reason="transparent huge pages are off here")


@needs_thp
def test_a_huge_page_tensor_is_aligned_zeroed_writable_and_outlives_its_maker():
    t = huge_page_empty((3, 1000, 7), torch.bfloat16)
    assert t.shape == (3, 1000, 7) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    assert bool((t == 0).all())  # fresh anonymous memory
    view = t[1]
    del t
    gc.collect()
    view.fill_(2.5)  # the mapping is alive while a view of it is
    assert float(view.float().sum()) == 2.5 * 7000


def test_without_huge_pages_the_allocator_refuses_and_the_cache_keeps_ordinary_pools(monkeypatch):
    monkeypatch.setattr(host_memory, "huge_pages_available", lambda: False)
    with pytest.raises(RuntimeError, match="transparent huge pages are not available"):
        huge_page_empty((4,), torch.float32)
    from tileops.serving import kv_cache

    monkeypatch.setattr(kv_cache, "huge_pages_available", lambda: False)
    cache = PagedKVCache(4, 16, 2, 8, huge_pages=True)
    assert cache.huge_pages is False and bool((cache.k_pages == 0).all())


@needs_thp
def test_a_cache_on_huge_pages_keeps_its_pools_there_and_its_tokens_through_a_growth():
    cache = PagedKVCache(4, 16, 2, 8, num_layers=2, huge_pages=True)
    assert cache.huge_pages and all(t.data_ptr() % HUGE_PAGE == 0 for t in cache.k_layers + cache.v_layers)
    s = cache.add_sequence()
    k = torch.randn(2, 40, 2, 8).bfloat16()
    cache.append(s, k, -k)
    cache.grow(16)
    assert all(t.data_ptr() % HUGE_PAGE == 0 and t.shape[0] == 256 for t in cache.k_layers + cache.v_layers)
    keys, values = cache.gather(s, layer=1)
    assert torch.equal(keys, k[1]) and torch.equal(values, -k[1])
