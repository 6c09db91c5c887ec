"""What enable fuses: projections that share an input run as one GEMM over views of one
stacked weight (and get their own storage back at disable); where every layer is served,
the model's forward runs as one loop (_fused_model.py), giving the bits of transformers'
forward over the patched modules, to which anything it does not serve (a hook, hidden
states, a layer with a piece on torch) falls back.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tileops.serving.host_memory import HUGE_PAGE, huge_pages_available

from ._models import ARCHS, _close, _model, _prompt, _teacher_forced, hf


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_projections_sharing_an_input_run_as_one_gemm_over_views_of_one_weight(arch, target):
    """q/k/v (with Qwen2's biases) and gate/up become views into one stacked weight while
    enabled (no second copy), and get their own storage back, same values, at disable."""
    model = _model(arch)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = {n: p for n, p in model.named_parameters()}
    report = hf.enable(model, target=target)
    assert report.count("stacked projections") == 2 * model.config.num_hidden_layers
    assert report.count("decoder layer") == model.config.num_hidden_layers
    stacked = attn._tileops.qkv.weight
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    if arch == "qwen2":
        assert attn.q_proj.bias.untyped_storage().data_ptr() == attn._tileops.qkv.bias.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp._tileops.gate_up.weight.untyped_storage().data_ptr()
    if huge_pages_available():  # the streamed weights start on 2 MiB pages
        served = [stacked, mlp._tileops.gate_up.weight, attn.o_proj.weight, mlp.down_proj.weight, model.lm_head.weight]
        assert all(w.data_ptr() % HUGE_PAGE == 0 for w in served)
        assert report.huge_page_bytes == sum(
            w.numel() * w.element_size()
            for n, w in model.named_parameters()
            if n.endswith("weight") and ("proj" in n or "lm_head" in n)
        )
    hf.disable(model)
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameter objects
    assert attn.q_proj.weight.untyped_storage().data_ptr() != attn.k_proj.weight.untyped_storage().data_ptr()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@contextlib.contextmanager
def _fused_calls(model):
    """Counts the forwards the fused model (_fused_model.py) served while active: its
    forward's calls, and the causal LM decode steps it served whole (decode_logits)."""
    calls, cls = [], type(model.model._tileops.fused)
    forward, decode_logits = cls.forward, cls.decode_logits

    def served(self, *a, **k):
        step = decode_logits(self, *a, **k)
        if step is not None:
            calls.append(1)
        return step

    cls.forward = lambda self, *a, **k: calls.append(1) or forward(self, *a, **k)
    cls.decode_logits = served
    try:
        yield calls
    finally:
        cls.forward, cls.decode_logits = forward, decode_logits


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fused_model_forward_gives_the_bits_of_transformers_forward_over_the_patched_modules(arch, target):
    """Where every layer is fused, a forward runs as one loop (_fused_model.py); a hook on
    any module sends it through transformers' forward instead. Both give the same bits, at
    a left-padded prefill and at every decode step."""
    model = _model(arch)
    report = hf.enable(model, target=target)
    assert report.count("model forward") == 1
    ids, mask = _prompt(True)
    with _fused_calls(model) as calls:
        looped = _teacher_forced(model, ids, mask, steps=4)
        assert len(calls) == 5
        hook = model.model.layers[-1].mlp.register_forward_hook(lambda *a: None)
        through_transformers = _teacher_forced(model, ids, mask, tokens=looped[2], steps=4)
        hook.remove()
    assert len(calls) == 5  # none with the hook
    assert torch.equal(looped[0], through_transformers[0]) and torch.equal(looped[1], through_transformers[1])


def test_asking_for_hidden_states_runs_transformers_forward_and_returns_them(target):
    model = _model("llama")
    hf.enable(model, target=target)
    ids, mask = _prompt(False)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert plain.hidden_states is None
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert torch.equal(out.logits, plain.logits)


def test_the_base_model_called_alone_positionally_and_as_a_tuple_runs_the_fused_forward(target):
    model = _model("qwen3")
    hf.enable(model, target=target)
    ids, _ = _prompt(False)
    with _fused_calls(model) as calls, torch.no_grad():
        want = model.model(input_ids=ids).last_hidden_state
        got = model.model(ids, return_dict=False)[0]
        embeds = model.model(inputs_embeds=model.model.embed_tokens(ids)).last_hidden_state
    assert len(calls) == 3
    assert torch.equal(got, want) and torch.equal(embeds, want)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model.model()


def test_a_layer_with_a_piece_on_torch_keeps_transformers_layer_forward(target):
    model = _model("llama", hidden_act="relu")  # the MLP stays on torch (strict=False)
    ids, mask = _prompt(True)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        report = hf.enable(model, target=target, strict=False)
        got = model(input_ids=ids, attention_mask=mask).logits
    assert report.count("decoder layer") == 0 and report.count("stacked projections") == 2  # q/k/v only
    assert "forward" not in model.model.layers[0].__dict__
    _close(got[mask.bool()], ref[mask.bool()], torch.bfloat16, "relu MLP on torch")
