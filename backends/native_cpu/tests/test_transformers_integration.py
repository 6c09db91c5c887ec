"""Hugging Face models on tileops (tileops.integrations.transformers) with the native
kernels: each architecture, on a tiny random config, gives HF eager's logits at prefill
and at each of 16 decode steps, with and without left padding; greedy generate agrees
while the reference is sure; disable gives back HF's outputs bit for bit; a checkpoint
save_pretrained wrote loads enabled; what cannot be served is refused by name.

Lives in the native backend's suite because it needs kernels for every op (the in-tree
ones are CUDA): it runs where tileops and tileops-native-cpu are installed.
"""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install tileops[transformers])")
hf = pytest.importorskip("tileops.integrations.transformers")
from tileops.testing.agreement import check_greedy_agreement  # noqa: E402
from tileops.serving import PagedKVCache  # noqa: E402

TARGET = "native_cpu"
STEPS = 16
# |enabled - eager| <= ATOL + RTOL * max|eager logits| per step. Measured on these configs:
# at most 0.009 (bf16, Gemma 3) and 0.0011 (fp16) against logits up to 0.63, i.e. one or
# two ulps of the logits' own dtype; the bounds leave about 2x.
TOL = {torch.bfloat16: (0.004, 0.02), torch.float16: (0.001, 0.003)}

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
              pad_token_id=0)


def _config(arch: str, **extra):
    c = transformers
    if arch == "llama":
        return c.LlamaConfig(**{**COMMON, **extra})
    if arch == "llama31":  # llama3 RoPE scaling
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return c.LlamaConfig(**{**COMMON, "rope_parameters": rope, **extra})
    if arch == "llama_yarn":  # YaRN RoPE scaling, with its own betas and attention factor
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
                "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.3}
        return c.LlamaConfig(**{**COMMON, "rope_parameters": rope, **extra})
    if arch == "mistral":  # a window shorter than the prompts
        return c.MistralConfig(**{**COMMON, "sliding_window": 8, **extra})
    if arch == "qwen2":  # q/k/v biases
        return c.Qwen2Config(**{**COMMON, **extra})
    if arch == "qwen3":  # q/k norm
        return c.Qwen3Config(**{**COMMON, **extra})
    if arch == "gemma3":  # local (window 8, theta 1e4) and global (theta 1e6) layers, 1 + w norms, scale
        return c.Gemma3TextConfig(**{**COMMON, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                                     "query_pre_attn_scalar": 24, "hidden_activation": "gelu_pytorch_tanh", **extra})
    raise KeyError(arch)


ARCHS = ["llama", "llama31", "llama_yarn", "mistral", "qwen2", "qwen3", "gemma3"]


def _model(arch: str, dtype: torch.dtype = torch.bfloat16, **extra):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch, **extra))
    with torch.no_grad():  # random norm weights, so Gemma's (1 + w) and Llama's w both matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0 if arch == "gemma3" else 1.0, 0.2)
    return model.to(dtype).eval()


def _prompt(padded: bool):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (2, 12), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :5] = 0
        ids[0, :5] = 0
    return ids, mask


def _cache(out):
    return out.cache if "cache" in out else out.past_key_values


def _cache_kw(model) -> str:
    """transformers 5.24 renamed forward's past_key_values to cache (the old name warns)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def _teacher_forced(model, ids, mask, tokens=None, steps=STEPS):
    """Prefill logits [B, S, V], then `steps` decode steps feeding `tokens` [B, steps] (the
    reference's greedy tokens when None): returns (prefill, [steps, B, V], tokens)."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    prefill, cache, step_logits = out.logits, _cache(out), []
    last = prefill[:, -1]
    fed = []
    for t in range(steps):
        nxt = last.argmax(-1) if tokens is None else tokens[:, t]
        fed.append(nxt)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, use_cache=True, **{_cache_kw(model): cache})
        cache, last = _cache(out), out.logits[:, -1]
        step_logits.append(last)
    return prefill, torch.stack(step_logits), torch.stack(fed, dim=1)


def _close(actual, expected, dtype, what):
    atol, rtol = TOL[dtype]
    bound = atol + rtol * expected.float().abs().max()
    err = (actual.float() - expected.float()).abs().max()
    assert err <= bound, f"{what}: max |enabled - eager| = {err:.4g} > {bound:.4g}"


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_eager_at_prefill_and_every_decode_step(arch, padded):
    dtype = torch.bfloat16
    model = _model(arch, dtype)
    ids, mask = _prompt(padded)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    report = hf.enable(model, target=TARGET)
    assert report.count("attention") == 2 and report.count("rmsnorm") >= 5 and report.count("mlp") == 2
    assert report.count("linear") == 2 * 7 + 1
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens)
    real = mask.bool()
    _close(prefill[real], ref_prefill[real], dtype, f"{arch} prefill")
    for t in range(STEPS):
        _close(steps[t], ref_steps[t], dtype, f"{arch} decode step {t}")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_float16_logits_match_eager_within_its_tolerance(arch):
    model = _model(arch, torch.float16)
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    hf.enable(model, target=TARGET)
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.float16, f"{arch} prefill")
    _close(steps, ref_steps, torch.float16, f"{arch} decode")


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_agrees_while_the_reference_is_sure(arch):
    model = _model(arch)
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
        hf.enable(model, target=TARGET)
        got = model.generate(ids, **kw)
    ref_logits = torch.stack(ref.logits)  # [steps, B, V]
    atol, rtol = TOL[torch.bfloat16]
    tol = atol + rtol * float(ref_logits.float().abs().max())
    confident = check_greedy_agreement(ref_logits, ref.sequences[:, ids.shape[1]:], got[:, ids.shape[1]:], tol)
    assert max(confident) > 0, "the reference was never sure: the test checked nothing"


def test_sampling_generate_runs_and_keeps_the_prompt():
    model = _model("qwen3")
    ids, mask = _prompt(True)
    hf.enable(model, target=TARGET)
    torch.manual_seed(3)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, pad_token_id=0)
    assert out.shape == (2, ids.shape[1] + 6) and torch.equal(out[:, : ids.shape[1]], ids)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3"])
def test_disable_gives_back_eager_outputs_bit_for_bit(arch):
    model = _model(arch)
    ids, mask = _prompt(True)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        hf.enable(model, target=TARGET)
        model(input_ids=ids, attention_mask=mask)
        hf.disable(model)
        assert model.config._attn_implementation != hf.ATTENTION_NAME
        assert not any("forward" in m.__dict__ or "_tileops" in m.__dict__ for m in model.modules())
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)
        again = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(again, generated)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_projections_sharing_an_input_run_as_one_gemm_over_views_of_one_weight(arch):
    """q/k/v (with Qwen2's biases) and gate/up become views into one stacked weight while
    enabled (no second copy), and get their own storage back, same values, at disable."""
    model = _model(arch)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = {n: p for n, p in model.named_parameters()}
    report = hf.enable(model, target=TARGET)
    assert report.count("stacked projections") == 2 * model.config.num_hidden_layers
    assert report.count("decoder layer") == model.config.num_hidden_layers
    stacked = attn._tileops.qkv.weight
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    if arch == "qwen2":
        assert attn.q_proj.bias.untyped_storage().data_ptr() == attn._tileops.qkv.bias.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp._tileops.gate_up.weight.untyped_storage().data_ptr()
    hf.disable(model)
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameter objects
    assert attn.q_proj.weight.untyped_storage().data_ptr() != attn.k_proj.weight.untyped_storage().data_ptr()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_layer_with_a_piece_on_torch_keeps_transformers_layer_forward():
    model = _model("llama", hidden_act="relu")  # the MLP stays on torch (strict=False)
    ids, mask = _prompt(True)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        report = hf.enable(model, target=TARGET, strict=False)
        got = model(input_ids=ids, attention_mask=mask).logits
    assert report.count("decoder layer") == 0 and report.count("stacked projections") == 2  # q/k/v only
    assert "forward" not in model.model.layers[0].__dict__
    _close(got[mask.bool()], ref[mask.bool()], torch.bfloat16, "relu MLP on torch")


def test_the_loader_enables_a_checkpoint_that_save_pretrained_wrote(tmp_path):
    model = _model("qwen2")
    model.save_pretrained(tmp_path)
    ids, mask = _prompt(False)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        loaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, target=TARGET)
        assert loaded.tileops_report.count("attention") == 2 and not loaded.training
        got = loaded(input_ids=ids, attention_mask=mask).logits
    _close(got, ref, torch.bfloat16, "loaded checkpoint")


def test_a_prompt_longer_than_the_window_decodes_with_the_window():
    """Mistral with window 8 and a 12-token prompt: prefill and decode see only the last 8."""
    model = _model("mistral")
    ids, mask = _prompt(False)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    no_window = _model("mistral", sliding_window=None)
    ref_nowin = _teacher_forced(no_window, ids, mask, tokens)[1]
    assert (ref_nowin - ref_steps).abs().max() > 0.1  # the window matters on this prompt
    hf.enable(model, target=TARGET)
    _close(_teacher_forced(model, ids, mask, tokens)[1], ref_steps, torch.bfloat16, "windowed decode")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_long_padded_prompt_spans_pages_and_the_cache_grows_while_decoding(arch, monkeypatch):
    """300 tokens (19 pages of 16), 37 of them padding in row 0, then 40 steps: the pool
    made at prefill (room for 16 more tokens here) runs out and is doubled mid-decode, and
    the block table widens past 16 pages."""
    monkeypatch.setattr(hf._cache, "MIN_DECODE_ROOM", 16)
    model = _model(arch, max_position_embeddings=512)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 128, (2, 300), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :37] = 0
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=40)
    hf.enable(model, target=TARGET)
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


# ---- refusals ------------------------------------------------------------------------


def test_a_float32_model_is_refused_with_the_dtype_to_load_with():
    model = _model("llama", torch.float32)
    with pytest.raises(hf.UnsupportedModelError, match=r"torch.float32.*torch_dtype=torch.bfloat16"):
        hf.enable(model, target=TARGET)
    assert "forward" not in model.model.layers[0].self_attn.__dict__  # nothing was patched


def test_an_unknown_architecture_and_moe_are_refused_by_name():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(hf.UnsupportedModelError, match="GPT2LMHeadModel: architecture"):
        hf.enable(gpt2.to(torch.bfloat16).eval())
    moe = transformers.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    with pytest.raises(hf.UnsupportedModelError, match="Qwen3MoeForCausalLM: mixture-of-experts"):
        hf.enable(transformers.AutoModelForCausalLM.from_config(moe).to(torch.bfloat16).eval())


def test_an_unserved_activation_names_module_feature_and_value_and_strict_false_lists_it():
    model = _model("llama", hidden_act="relu")
    with pytest.raises(hf.UnsupportedModelError, match=r"model.layers.0.mlp: gated MLP \(config hidden_act='relu'"):
        hf.enable(model, target=TARGET)
    report = hf.enable(model, target=TARGET, strict=False)
    assert ("model.layers.0.mlp", "gated MLP") in [(m, f) for m, f, _ in report.on_torch]
    assert report.count("mlp") == 0 and report.count("attention") == 2
    ids, mask = _prompt(True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # what stays on torch still runs


def test_an_unserved_rope_scaling_is_refused_and_keeps_attention_on_torch_when_not_strict():
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    model = _model("llama", rope_parameters=rope)
    with pytest.raises(hf.UnsupportedModelError, match=r"self_attn: rotary embedding \(rope_parameters rope_type='linear'"):
        hf.enable(model, target=TARGET)
    report = hf.enable(model, target=TARGET, strict=False)
    assert report.count("attention") == 0 and model.config._attn_implementation != hf.ATTENTION_NAME


def test_partial_rotary_is_refused_where_transformers_rotates_the_whole_head():
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    model = _model("qwen3", rope_parameters=rope)
    with pytest.raises(hf.UnsupportedModelError, match=r"partial_rotary_factor=0.5"):
        hf.enable(model, target=TARGET)


def test_a_training_mode_model_and_a_second_enable_are_refused():
    model = _model("llama").train()
    with pytest.raises(hf.UnsupportedModelError, match="training mode"):
        hf.enable(model, target=TARGET)
    model.eval()
    hf.enable(model, target=TARGET)
    with pytest.raises(hf.UnsupportedModelError, match="already enabled"):
        hf.enable(model, target=TARGET)


def test_a_position_past_max_position_embeddings_is_refused_even_in_a_reused_tensor():
    model = _model("llama", max_position_embeddings=16)
    hf.enable(model, target=TARGET)
    ids = torch.randint(1, 128, (1, 4))
    pos = torch.arange(4)[None]
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos)  # every layer checks this tensor once
        pos[0, -1] = 16  # the same tensor, changed in place
        with pytest.raises(ValueError, match="position 16 is past max_position_embeddings=16"):
            model(input_ids=ids, position_ids=pos)


def test_right_padding_is_refused_at_the_call_not_served_wrong():
    model = _model("llama")
    hf.enable(model, target=TARGET)
    ids, mask = _prompt(False)
    mask[1, -3:] = 0
    with pytest.raises(ValueError, match="left padding only"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def test_the_attention_name_alone_is_refused_on_a_model_enable_did_not_patch():
    model = _model("llama")
    hf.enable(_model("llama"), target=TARGET)  # registers "tileops" with transformers
    model.config._attn_implementation = hf.ATTENTION_NAME
    ids, mask = _prompt(False)
    with pytest.raises(RuntimeError, match="call enable"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, use_cache=False)



def test_torch_compile_runs_the_enabled_forward_with_and_without_the_cache():
    """Graph breaks at the mask and cache bookkeeping (Python), the ops stay custom ops."""
    model = _model("qwen3", num_hidden_layers=1)
    hf.enable(model, target=TARGET)
    ids, mask = _prompt(True)
    compiled = torch.compile(model)
    with torch.no_grad():
        for use_cache in (False, True):
            want = model(input_ids=ids, attention_mask=mask, use_cache=use_cache).logits
            got = compiled(input_ids=ids, attention_mask=mask, use_cache=use_cache).logits
            assert torch.equal(got[mask.bool()], want[mask.bool()])


def test_generate_with_a_cache_of_ours_or_without_a_cache_gives_the_same_tokens():
    model = _model("gemma3")
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    hf.enable(model, target=TARGET)
    with torch.no_grad():
        made = model.generate(ids, **kw)
        passed = model.generate(ids, past_key_values=hf.TileopsCache(config=model.config), **kw)
        uncached = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(made, passed) and torch.equal(made, uncached)


def test_a_cache_of_another_class_with_tokens_in_it_is_refused():
    model = _model("llama")
    ids, mask = _prompt(False)
    with torch.no_grad():
        dynamic = _cache(model(input_ids=ids, attention_mask=mask, use_cache=True))
        hf.enable(model, target=TARGET)
        with pytest.raises(TypeError, match="reads a TileopsCache, got DynamicCache"):
            model(input_ids=ids[:, :1], attention_mask=torch.cat([mask, mask[:, :1]], 1), use_cache=True,
                  **{_cache_kw(model): dynamic})
