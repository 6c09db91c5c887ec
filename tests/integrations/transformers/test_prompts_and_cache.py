"""Prompts and the paged cache: packed sequences attend each on its own, a chunk onto
cached tokens and a prompt longer than the window match eager, a long padded prompt
spans pages and the cache grows while decoding, and generate gives the same tokens with
a cache made by the caller or none.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from tileops.serving import PagedKVCache

from ._models import (
    _cache,
    _cache_kw,
    _close,
    _long_padded_prompt,
    _model,
    _prompt,
    _teacher_forced,
    hf,
)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_sequences_packed_into_a_row_attend_each_on_its_own_as_in_transformers(arch, target):
    """Without a cache or a mask, position ids that restart within a row mark packed
    sequences (transformers' packed format); each attends only to itself."""
    model = _model(arch)
    ids, _ = _prompt(False)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        hf.enable(model, target=target)
        got = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        alone = model(input_ids=ids[:1, 5:], use_cache=False).logits  # row 0's second sequence by itself
        # with a mask given, transformers reads the rows as one sequence each, and so does tileops
        masked = model(
            input_ids=ids, position_ids=position_ids, attention_mask=torch.ones_like(ids), use_cache=False
        ).logits
        hf.disable(model)
        masked_ref = model(
            input_ids=ids, position_ids=position_ids, attention_mask=torch.ones_like(ids), use_cache=False
        ).logits
    _close(got, ref, torch.bfloat16, f"{arch} packed")
    _close(got[0, 5:], alone[0], torch.bfloat16, f"{arch} packed sequence alone")
    _close(masked, masked_ref, torch.bfloat16, f"{arch} a mask given: one sequence per row")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_a_chunk_onto_cached_tokens_matches_eager_over_the_whole_prompt(arch, padded, target):
    """Chunked prefill: 12 tokens cached, then 6 more in one forward (each sees the cache
    and its own causal prefix); Gemma 3's window of 8 reaches back into the cache."""
    model = _model(arch)
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 128, (2, 18), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :5] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        hf.enable(model, target=target)
        first = model(input_ids=ids[:, :12], attention_mask=mask[:, :12], use_cache=True)
        second = model(input_ids=ids[:, 12:], attention_mask=mask, use_cache=True, **{_cache_kw(model): _cache(first)})
    _close(second.logits, ref[:, 12:], torch.bfloat16, f"{arch} chunk onto the cache")
    _close(first.logits[mask[:, :12].bool()], ref[:, :12][mask[:, :12].bool()], torch.bfloat16, f"{arch} first chunk")


def test_a_prompt_longer_than_the_window_decodes_with_the_window(target):
    """Mistral with window 8 and a 12-token prompt: prefill and decode see only the last 8."""
    model = _model("mistral")
    ids, mask = _prompt(False)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    no_window = _model("mistral", sliding_window=None)
    ref_nowin = _teacher_forced(no_window, ids, mask, tokens)[1]
    assert (ref_nowin - ref_steps).abs().max() > 0.1  # the window matters on this prompt
    hf.enable(model, target=target)
    _close(_teacher_forced(model, ids, mask, tokens)[1], ref_steps, torch.bfloat16, "windowed decode")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_long_padded_prompt_spans_pages_and_the_cache_grows_while_decoding(arch, monkeypatch, target):
    """300 tokens (19 pages of 16), 37 of them padding in row 0, then 40 steps: the pool
    made at prefill (room for 16 more tokens here) runs out and is doubled mid-decode, and
    the block table widens past 16 pages."""
    model, ids, mask = _long_padded_prompt(arch, monkeypatch, length=300, pads=37, seed=2)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=40)
    hf.enable(model, target=target)
    grown = []
    monkeypatch.setattr(PagedKVCache, "grow", _spy(PagedKVCache.grow, grown))
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, steps=40)
    assert len(grown) == 1  # once: every layer's pools grow together (one page table)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, f"{arch} long prefill")
    _close(steps, ref_steps, torch.bfloat16, f"{arch} decode after growth")


def _spy(method, calls):
    def spied(self, *args):
        calls.append(args)
        return method(self, *args)

    return spied


def test_generate_with_a_cache_of_ours_or_without_a_cache_gives_the_same_tokens(target):
    model = _model("gemma3")
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    hf.enable(model, target=target)
    with torch.no_grad():
        made = model.generate(ids, **kw)
        # the keyword the model's forward names (transformers 5.24 renamed past_key_values to cache)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        passed = model.generate(ids, **{name: hf.TileopsCache(config=model.config)}, **kw)
        uncached = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(made, passed) and torch.equal(made, uncached)
