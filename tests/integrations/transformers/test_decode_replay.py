"""Decode steps replayed from a captured graph of op launches (_replay.py): the loop's
bits across pages and growth, a plain causal LM's head in the graph, a capture that torch
computed in fails and the step stands, a replay is checked as a call is, and
TILEOPS_DECODE_REPLAY=0 turns it off.
"""

from __future__ import annotations

import pytest
import torch

from ._models import _cache, _cache_kw, _long_padded_prompt, _model, _prompt, _teacher_forced, hf


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "granite", "olmo2"])
def test_replayed_decode_steps_give_the_loops_bits_across_pages_and_growth(arch, monkeypatch, target):
    """Decode steps replayed from a captured graph of op launches (_replay.py) give the logits of
    the same steps run by the fused loop, bit for bit: 40 steps over page boundaries, a
    wider block table and a pool that grows mid-decode (each of which makes the next step
    record anew), for one sequence and for a left-padded batch of two."""
    model, ids, mask = _long_padded_prompt(arch, monkeypatch, length=250, pads=9, seed=4)
    hf.enable(model, target=target)
    fused = model.model._tileops.fused
    replay = fused.replay
    assert replay is not None
    for rows in (slice(1, 2), slice(0, 2)):
        fused.replay = None
        _, looped, tokens = _teacher_forced(model, ids[rows], mask[rows], steps=40)
        fused.replay = replay
        _, replayed, _ = _teacher_forced(model, ids[rows], mask[rows], tokens, steps=40)
        assert torch.equal(replayed, looped)
    assert replay.replays >= 60 and not replay.refused


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "granite", "olmo2"])
def test_a_plain_causal_lm_decodes_with_its_head_in_the_graph_and_transformers_bits(arch, target):
    """Llama, Mistral, Qwen2/3, Phi-3 and OLMo 2's causal LMs serve a decode step whole
    (_patch.py): the layers and lm_head replay as one graph, giving the logits of
    transformers' forward, to which a hook on lm_head sends the step (bit for bit, a
    left-padded batch). Gemma 3 caps its logits after the head and Granite scales them:
    they keep transformers' forward over replayed layers; disable removes the patch."""
    model = _model(arch)
    report = hf.enable(model, target=target)
    plain = arch not in ("gemma3", "granite")
    assert report.count("causal LM decode step") == plain
    ids, mask = _prompt(True)
    whole = _teacher_forced(model, ids, mask, steps=4)
    last = model.model._tileops.fused.replay.recording.graph.descriptions()[-1]
    assert last.endswith(f"-> [2, {model.config.vocab_size}]") == plain  # the head's GEMM ends the graph
    hook = model.lm_head.register_forward_hook(lambda *a: None)
    through_transformers = _teacher_forced(model, ids, mask, tokens=whole[2], steps=4)
    hook.remove()
    assert torch.equal(whole[1], through_transformers[1])
    if plain:  # input ids by position, as model(ids) passes them
        cache = _cache(model(input_ids=ids, attention_mask=mask, use_cache=True))
        replays = model.model._tileops.fused.replay.replays
        for t in range(2):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = model(
                whole[2][:, t : t + 1], attention_mask=mask, use_cache=True, **{_cache_kw(model): cache}
            ).logits
            assert torch.equal(logits[:, -1], whole[1][t])
        replay = model.model._tileops.fused.replay
        assert replay.replays == replays + 1  # the first step captures (its kernels were built before)
        assert replay.recording.graph.descriptions()[-1].endswith(f"-> [2, {model.config.vocab_size}]")
    hf.disable(model)
    assert "forward" not in model.__dict__ and "_tileops" not in model.__dict__


def test_a_capture_in_which_torch_computed_fails_and_the_step_stands(monkeypatch, target):
    """Only op launches are replayed: where torch computes between them (here a copy of
    the embeddings before the first norm), the capture fails, the step keeps the loop's
    result, and after three failures the batch size is not captured again."""
    model = _model("llama")
    hf.enable(model, target=target)
    ids, mask = _prompt(False)
    fused = model.model._tileops.fused
    replay, fused.replay = fused.replay, None
    _, looped, tokens = _teacher_forced(model, ids, mask, steps=6)
    fused.replay = replay
    norm = hf.fused.model.rmsnorm_forward
    monkeypatch.setattr(hf.fused.model, "rmsnorm_forward", lambda module, x: norm(module, x.clone()))
    _, watched, _ = _teacher_forced(model, ids, mask, tokens, steps=6)
    assert torch.equal(watched, looped)
    assert replay.replays == 0 and replay.failed[2] == 3
    assert replay.refused[2].endswith(
        "torch computed between the captured launches (a replay would skip it): aten.clone.default"
    )


def test_a_replayed_step_is_as_checked_as_a_called_one(target):
    """A replay checks each launch as a call is checked, on what its tensors hold now: a
    position past the RoPE tables is refused at the replay, not read out of bounds."""
    model = _model("llama")
    hf.enable(model, target=target)
    ids = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(4):
            out = model(input_ids=ids[:, :1], use_cache=True, **{_cache_kw(model): _cache(out)})
        replay = model.model._tileops.fused.replay
        # the first decode step built its kernels, the second captured the graph, the next two replayed it
        assert replay.replays == 2
        assert 0 < replay.replay_seconds < 60  # the last replay's wall time (hf_profile.py's generate split)
        replay.recording.inputs[1].fill_(10**6)  # a position no RoPE table holds
        with pytest.raises(ValueError, match="position_ids"):
            replay.recording.graph.replay()


def test_replay_is_off_where_tileops_decode_replay_is_0(monkeypatch, target):
    monkeypatch.setenv("TILEOPS_DECODE_REPLAY", "0")
    model = _model("llama")
    hf.enable(model, target=target)
    assert model.model._tileops.fused.replay is None
