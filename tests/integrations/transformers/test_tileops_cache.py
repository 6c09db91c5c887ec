"""TileopsCache: a transformers Cache whose layers share one page table (one Step per
forward), keep real tokens only, count every position seen (pads included), and grow
every layer's pools together without losing a token."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install tileops[transformers])")
from tileops.integrations.transformers import TileopsCache  # noqa: E402
from tileops.integrations.transformers import cache as cache_module  # noqa: E402


def _write(cache, layer, step, k, v):
    """What the paged attention op does with a step: each sequence's new rows into its
    next positions of this layer's pools."""
    k_pages, v_pages = layer.pools()
    for b, (seq, cached, n) in enumerate(zip(cache.seqs, step.cached, step.counts)):
        rows = cache.paged.rows(seq)[cached : cached + n]
        k_pages[rows], v_pages[rows] = k[b, -n:], v[b, -n:]


def test_one_step_per_forward_serves_every_layer():
    cache = TileopsCache(num_layers=3)
    k = torch.randn(2, 5, 2, 8).bfloat16()
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    steps = [cache.step_for(layer, 5, mask, k) for layer in cache.layers]
    assert steps[0] is steps[1] is steps[2]
    step = steps[0]
    assert step.counts == (3, 5) and step.cached == (0, 0)
    assert step.cu_seqlens_q.tolist() == [0, 3, 8] and step.cache_seqlens.tolist() == [0, 0]
    assert step.block_table.dtype == torch.int32 and step.width == 16  # the narrowest table
    assert cache.lengths(2) == [3, 5] and cache.get_seq_length() == 5  # pads count as positions seen
    decode = [cache.step_for(layer, 1, None, k[:, :1]) for layer in cache.layers]
    assert decode[0] is decode[2] and decode[0].cached == (3, 5) and decode[0].cache_seqlens.tolist() == [3, 5]


def test_every_layers_pools_grow_together_and_keep_their_tokens(monkeypatch):
    monkeypatch.setattr(cache_module, "MIN_DECODE_ROOM", 8)
    cache = TileopsCache(num_layers=2)
    written = {i: [] for i in range(2)}
    for q_len in [5] + [1] * 60:
        for layer in cache.layers:
            k = torch.randn(2, q_len, 2, 8).bfloat16()
            step = cache.step_for(layer, q_len, None, k)
            _write(cache, layer, step, k, -k)
            written[layer.index].append(k)
    assert cache.paged.num_pages > 2 * 1  # grown from the first pool (13 tokens: one page each)
    for i in range(2):
        for b in range(2):
            keys, values = cache.paged.gather(cache.seqs[b], layer=i)
            want = torch.cat([k[b] for k in written[i]])
            assert torch.equal(keys, want) and torch.equal(values, -want)
    assert cache.lengths(2) == [65, 65] and cache.step.block_table.shape == (2, 16)


def test_a_layer_that_skips_a_forward_is_refused():
    cache = TileopsCache(num_layers=2)
    k = torch.randn(1, 4, 2, 8).bfloat16()
    cache.step_for(cache.layers[0], 4, None, k)
    cache.step_for(cache.layers[0], 1, None, k[:, :1])  # layer 1 never saw the prompt
    with pytest.raises(RuntimeError, match="layer 1 has seen 0 positions and got 1 more"):
        cache.step_for(cache.layers[1], 1, None, k[:, :1])


def test_right_padding_is_refused_with_the_fix():
    cache = TileopsCache(num_layers=1)
    with pytest.raises(ValueError, match="left padding only.*padding_side='left'"):
        cache.step_for(cache.layers[0], 3, torch.tensor([[1, 1, 0]]), torch.randn(1, 3, 2, 8).bfloat16())


def test_the_sequence_length_counts_positions_seen_not_tokens_cached():
    cache = TileopsCache(num_layers=2)
    for layer in cache.layers:
        layer.seen += 12  # a 12-position prompt, whatever its padding
    assert cache.get_seq_length() == 12 and cache.get_mask_sizes(1, 0) == (13, 0)
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.paged is None


def test_the_cache_is_read_by_tileops_attention_only():
    with pytest.raises(NotImplementedError, match="read by tileops attention only"):
        TileopsCache(num_layers=1).update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), 0)
    with pytest.raises(TypeError, match="config="):
        TileopsCache()
