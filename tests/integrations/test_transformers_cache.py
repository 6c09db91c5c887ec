"""TileopsCache: a transformers Cache whose layers keep real tokens in a PagedKVCache,
count every position seen (pads included), and grow their pool without losing a token."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install tileops[transformers])")
from tileops.integrations.transformers import TileopsCache  # noqa: E402
from tileops.integrations.transformers import _cache as cache_module  # noqa: E402


def test_a_layer_grows_its_pool_and_keeps_every_token_in_order(monkeypatch):
    monkeypatch.setattr(cache_module, "MIN_DECODE_ROOM", 8)
    cache = TileopsCache(num_layers=1)
    layer = cache.layers[0]
    k = torch.randn(2 * 5, 2, 8).bfloat16()
    layer.append(k, -k, [5, 5])
    pages = layer.paged.num_pages
    steps = [torch.randn(2, 2, 8).bfloat16() for _ in range(60)]
    for s in steps:
        layer.append(s, -s, [1, 1])
    assert layer.paged.num_pages > pages
    for b in range(2):
        keys, values = layer.paged.gather(layer.seqs[b])
        want = torch.cat([k[5 * b : 5 * b + 5]] + [s[b : b + 1] for s in steps])
        assert torch.equal(keys, want) and torch.equal(values, -want)
    assert layer.lengths(2) == [65, 65]
    assert layer.block_table().shape == (2, 5)  # 65 tokens: 5 pages of 16 each


def test_the_sequence_length_counts_positions_seen_not_tokens_cached():
    cache = TileopsCache(num_layers=2)
    for layer in cache.layers:
        layer.seen += 12  # a 12-position prompt, whatever its padding
    assert cache.get_seq_length() == 12 and cache.get_mask_sizes(1, 0) == (13, 0)


def test_the_cache_is_read_by_tileops_attention_only():
    with pytest.raises(NotImplementedError, match="read by tileops attention only"):
        TileopsCache(num_layers=1).update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), 0)
    with pytest.raises(TypeError, match="config="):
        TileopsCache()
