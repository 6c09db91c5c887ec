"""Hugging Face models on tileops (tileops.integrations.transformers) with the native
kernels: each architecture, on a tiny random config, gives HF eager's logits at prefill
and at each of 16 decode steps, with and without left padding; greedy generate agrees
while the reference is sure; disable gives back HF's outputs bit for bit; a checkpoint
save_pretrained wrote loads enabled; what cannot be served is refused by name.

Lives in the native backend's suite because it needs kernels for every op (the in-tree
ones are CUDA): it runs where tileops and tileops-native-cpu are installed.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install tileops[transformers])")
hf = pytest.importorskip("tileops.integrations.transformers")
from tileops.testing.agreement import check_greedy_agreement  # noqa: E402
from tileops.serving import PagedKVCache  # noqa: E402
from tileops.serving.host_memory import HUGE_PAGE, huge_pages_available  # noqa: E402

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
    if arch == "llama_linear":  # linear RoPE scaling (every frequency / factor)
        return c.LlamaConfig(**{**COMMON, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0,
                                                               "factor": 2.5}, **extra})
    if arch == "llama_longrope":  # LongRoPE: short factors up to position 16, long ones for a call past it
        return c.LlamaConfig(**{**COMMON, "rope_parameters": LONGROPE, **extra})
    if arch == "mistral":  # a window shorter than the prompts
        return c.MistralConfig(**{**COMMON, "sliding_window": 8, **extra})
    if arch == "qwen2":  # q/k/v biases
        return c.Qwen2Config(**{**COMMON, **extra})
    if arch == "qwen3":  # q/k norm
        return c.Qwen3Config(**{**COMMON, **extra})
    if arch == "gemma3":  # local (window 8, theta 1e4) and global (theta 1e6) layers, 1 + w norms, scale
        return c.Gemma3TextConfig(**{**COMMON, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                                     "query_pre_attn_scalar": 24, "hidden_activation": "gelu_pytorch_tanh", **extra})
    if arch == "qwen3_moe":  # layer 0 a sparse block (8 experts, top 2, renormalised), layer 1 a dense MLP
        return c.Qwen3MoeConfig(**{**COMMON, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                   "norm_topk_prob": True, "mlp_only_layers": [1], **extra})
    if arch == "phi3":  # stacked qkv_proj and gate_up_proj; half of each head rotates
        return c.Phi3Config(**{**COMMON, **TOKENS, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                      "partial_rotary_factor": 0.5}, **extra})
    if arch == "phi3_longrope":  # LongRoPE on half of each head (long factors past position 16), a window of 8
        return c.Phi3Config(**{**COMMON, **TOKENS, "original_max_position_embeddings": 16, "sliding_window": 8,
                               "rope_parameters": PHI3_LONGROPE, **extra})
    if arch == "mixtral":
        # every layer a sparse block (float32 routing weights, always renormalised). The second
        # layer's routing reads the first's rounding, and with random weights a token's k-th and
        # k+1-th experts can be a rounding apart: every expert weighs in (top 4 of 4), so the
        # reference has no such choice to flip. The selection itself is tested on the router
        # alone (test_the_router_selects_and_weighs_as_transformers_router_ties_included).
        return c.MixtralConfig(**{**COMMON, "num_local_experts": 4, "num_experts_per_tok": 4, **extra})
    if arch == "qwen2_moe":  # layer 0 a sparse block with a shared expert and its sigmoid gate, layer 1 a dense MLP
        return c.Qwen2MoeConfig(**{**COMMON, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                   "shared_expert_intermediate_size": 64, "norm_topk_prob": False,
                                   "mlp_only_layers": [1], **extra})
    if arch == "granite":  # its four multipliers
        return c.GraniteConfig(**{**COMMON, **TOKENS, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                  "attention_multiplier": 0.2, "logits_scaling": 8.0, **extra})
    if arch == "olmo2":  # norms after attention and the MLP, q/k norms over whole projections
        return c.Olmo2Config(**{**COMMON, **TOKENS, **extra})
    raise KeyError(arch)


LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16, "factor": 4.0,
            "short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [1.0 + 0.9 * i for i in range(8)]}
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                 "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 3.0, 4.0, 5.0]}
TOKENS = dict(bos_token_id=1, eos_token_id=2)  # within the vocabulary of 128, as Llama's defaults are
ARCHS = ["llama", "llama31", "llama_yarn", "llama_linear", "llama_longrope", "mistral", "qwen2", "qwen3", "gemma3",
         "qwen3_moe", "phi3", "phi3_longrope", "mixtral", "qwen2_moe", "granite", "olmo2"]
# The sanitizer job (tools/sanitize.sh, which sets ASAN_OPTIONS) runs the per-architecture
# tests on the configs that between them reach every kernel and every kind of call the ten
# make (Llama 3.1's and LongRoPE's RoPE ops, Qwen2's bias, Qwen3's q/k norm, Gemma 3's
# sandwich, GELU-tanh and window, the MoE ops), and leaves torch.compile out (it checks
# TorchDynamo's tracing, not memory): the job's time is CI's largest share.
SANITIZED = "ASAN_OPTIONS" in os.environ
if SANITIZED:
    ARCHS = ["llama31", "llama_longrope", "qwen2", "qwen3", "gemma3", "qwen3_moe"]
# what enable replaces on these 2-layer configs, where it is not 2 attentions, 2 gated MLPs, 2 x 7 + 1 linears
# (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj; Qwen2-MoE: a dense MLP, then a shared expert
# and its gate beside the routed experts)
COUNTS = {"qwen3_moe": {"mlp": 1, "moe experts": 1, "moe router": 1, "linear": 2 * 4 + 3 + 1},
          "phi3": {"linear": 2 * 4 + 1}, "phi3_longrope": {"linear": 2 * 4 + 1},
          "mixtral": {"mlp": 0, "moe experts": 2, "moe router": 2, "linear": 2 * 4 + 1},
          "qwen2_moe": {"mlp": 2, "moe experts": 1, "moe router": 1, "linear": 2 * 4 + 3 + 3 + 1 + 1}}


def _model(arch: str, dtype: torch.dtype = torch.bfloat16, **extra):
    torch.manual_seed(0)
    # the reference: transformers' eager attention and eager experts loop, made in `dtype` as
    # from_pretrained(dtype=) makes it (RoPE frequencies stay float32; .to(dtype) would round them)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch, **extra), dtype=dtype,
                                                          attn_implementation="eager", experts_implementation="eager")
    with torch.no_grad():  # random norm weights, so Gemma's (1 + w) and Llama's w both matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0 if arch == "gemma3" else 1.0, 0.2)
            elif ".mlp.experts." in name or name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.1)  # experts and router that weigh in the logits (the default std is 0.02)
    return model.eval()


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


# the grad contexts people run a model in
CONTEXTS = {"plain": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _teacher_forced(model, ids, mask, tokens=None, steps=STEPS, context=torch.no_grad):
    with context():
        return _teacher_forced_steps(model, ids, mask, tokens, steps)


def _teacher_forced_steps(model, ids, mask, tokens, steps):
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
    want = {"attention": 2, "mlp": 2, "linear": 2 * 7 + 1, **COUNTS.get(arch, {})}
    assert {kind: report.count(kind) for kind in want} == want and report.count("rmsnorm") >= 5
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens)
    real = mask.bool()
    _close(prefill[real], ref_prefill[real], dtype, f"{arch} prefill")
    for t in range(STEPS):
        _close(steps[t], ref_steps[t], dtype, f"{arch} decode step {t}")


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3_moe"])
def test_every_grad_context_gives_eagers_logits_and_greedy_tokens(arch, context):
    """Plain (grad on), torch.no_grad and torch.inference_mode: the same logits at prefill
    and each decode step, and generate's greedy tokens (its search in C++ where served)."""
    model = _model(arch)
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    hf.enable(model, target=TARGET)
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, context=CONTEXTS[context])
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, f"{arch} prefill under {context}")
    _close(steps, ref_steps, torch.bfloat16, f"{arch} decode under {context}")
    with CONTEXTS[context]():
        got = model.generate(ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    atol, rtol = TOL[torch.bfloat16]
    check_greedy_agreement(ref_steps, tokens, got[:, ids.shape[1]:], atol + rtol * float(ref_steps.float().abs().max()))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3_moe"])
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


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3", "qwen3_moe"])
def test_disable_gives_back_eager_outputs_bit_for_bit(arch):
    model = _model(arch)
    ids, mask = _prompt(True)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        hf.enable(model, target=TARGET)
        model(input_ids=ids, attention_mask=mask)
        hf.disable(model)
        assert model.config._attn_implementation == "eager" and model.config._experts_implementation == "eager"
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
    if huge_pages_available():  # the streamed weights start on 2 MiB pages
        served = [stacked, mlp._tileops.gate_up.weight, attn.o_proj.weight, mlp.down_proj.weight, model.lm_head.weight]
        assert all(w.data_ptr() % HUGE_PAGE == 0 for w in served)
        assert report.huge_page_bytes == sum(w.numel() * w.element_size() for n, w in model.named_parameters()
                                             if n.endswith("weight") and ("proj" in n or "lm_head" in n))
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
def test_the_fused_model_forward_gives_the_bits_of_transformers_forward_over_the_patched_modules(arch):
    """Where every layer is fused, a forward runs as one loop (_fused_model.py); a hook on
    any module sends it through transformers' forward instead. Both give the same bits, at
    a left-padded prefill and at every decode step."""
    model = _model(arch)
    report = hf.enable(model, target=TARGET)
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


def test_asking_for_hidden_states_runs_transformers_forward_and_returns_them():
    model = _model("llama")
    hf.enable(model, target=TARGET)
    ids, mask = _prompt(False)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert plain.hidden_states is None
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert torch.equal(out.logits, plain.logits)


def test_the_base_model_called_alone_positionally_and_as_a_tuple_runs_the_fused_forward():
    model = _model("qwen3")
    hf.enable(model, target=TARGET)
    ids, _ = _prompt(False)
    with _fused_calls(model) as calls, torch.no_grad():
        want = model.model(input_ids=ids).last_hidden_state
        got = model.model(ids, return_dict=False)[0]
        embeds = model.model(inputs_embeds=model.model.embed_tokens(ids)).last_hidden_state
    assert len(calls) == 3
    assert torch.equal(got, want) and torch.equal(embeds, want)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model.model()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_sequences_packed_into_a_row_attend_each_on_its_own_as_in_transformers(arch):
    """Without a cache or a mask, position ids that restart within a row mark packed
    sequences (transformers' packed format); each attends only to itself."""
    model = _model(arch)
    ids, _ = _prompt(False)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        hf.enable(model, target=TARGET)
        got = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        alone = model(input_ids=ids[:1, 5:], use_cache=False).logits  # row 0's second sequence by itself
        # with a mask given, transformers reads the rows as one sequence each, and so does tileops
        masked = model(input_ids=ids, position_ids=position_ids, attention_mask=torch.ones_like(ids),
                       use_cache=False).logits
        hf.disable(model)
        masked_ref = model(input_ids=ids, position_ids=position_ids, attention_mask=torch.ones_like(ids),
                           use_cache=False).logits
    _close(got, ref, torch.bfloat16, f"{arch} packed")
    _close(got[0, 5:], alone[0], torch.bfloat16, f"{arch} packed sequence alone")
    _close(masked, masked_ref, torch.bfloat16, f"{arch} a mask given: one sequence per row")


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


@pytest.mark.parametrize("arch", ["qwen2", "qwen3_moe"])
def test_the_loader_enables_a_checkpoint_that_save_pretrained_wrote(tmp_path, arch):
    model = _model(arch)
    model.save_pretrained(tmp_path)
    ids, mask = _prompt(False)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        loaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, target=TARGET)
        assert loaded.tileops_report.count("attention") == 2 and not loaded.training
        got = loaded(input_ids=ids, attention_mask=mask).logits
    _close(got, ref, torch.bfloat16, "loaded checkpoint")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_a_chunk_onto_cached_tokens_matches_eager_over_the_whole_prompt(arch, padded):
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
        hf.enable(model, target=TARGET)
        first = model(input_ids=ids[:, :12], attention_mask=mask[:, :12], use_cache=True)
        second = model(input_ids=ids[:, 12:], attention_mask=mask, use_cache=True,
                       **{_cache_kw(model): _cache(first)})
    _close(second.logits, ref[:, 12:], torch.bfloat16, f"{arch} chunk onto the cache")
    _close(first.logits[mask[:, :12].bool()], ref[:, :12][mask[:, :12].bool()], torch.bfloat16, f"{arch} first chunk")


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
    model, ids, mask = _long_padded_prompt(arch, monkeypatch, length=300, pads=37, seed=2)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=40)
    hf.enable(model, target=TARGET)
    grown = []
    monkeypatch.setattr(PagedKVCache, "grow", _spy(PagedKVCache.grow, grown))
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, steps=40)
    assert len(grown) == 1  # once: every layer's pools grow together (one page table)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, f"{arch} long prefill")
    _close(steps, ref_steps, torch.bfloat16, f"{arch} decode after growth")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "granite", "olmo2"])
def test_replayed_decode_steps_give_the_loops_bits_across_pages_and_growth(arch, monkeypatch):
    """Decode steps replayed from a captured graph of op launches (_replay.py) give the logits of
    the same steps run by the fused loop, bit for bit: 40 steps over page boundaries, a
    wider block table and a pool that grows mid-decode (each of which makes the next step
    record anew), for one sequence and for a left-padded batch of two."""
    model, ids, mask = _long_padded_prompt(arch, monkeypatch, length=250, pads=9, seed=4)
    hf.enable(model, target=TARGET)
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
def test_a_plain_causal_lm_decodes_with_its_head_in_the_graph_and_transformers_bits(arch):
    """Llama, Mistral, Qwen2/3, Phi-3 and OLMo 2's causal LMs serve a decode step whole
    (_patch.py): the layers and lm_head replay as one graph, giving the logits of
    transformers' forward, to which a hook on lm_head sends the step (bit for bit, a
    left-padded batch). Gemma 3 caps its logits after the head and Granite scales them:
    they keep transformers' forward over replayed layers; disable removes the patch."""
    model = _model(arch)
    report = hf.enable(model, target=TARGET)
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
            logits = model(whole[2][:, t : t + 1], attention_mask=mask, use_cache=True, **{_cache_kw(model): cache}).logits
            assert torch.equal(logits[:, -1], whole[1][t])
        replay = model.model._tileops.fused.replay
        assert replay.replays == replays + 1  # the first step captures (its kernels were built before)
        assert replay.recording.graph.descriptions()[-1].endswith(f"-> [2, {model.config.vocab_size}]")
    hf.disable(model)
    assert "forward" not in model.__dict__ and "_tileops" not in model.__dict__


def test_a_capture_in_which_torch_computed_fails_and_the_step_stands(monkeypatch):
    """Only op launches are replayed: where torch computes between them (here a copy of
    the embeddings before the first norm), the capture fails, the step keeps the loop's
    result, and after three failures the batch size is not captured again."""
    model = _model("llama")
    hf.enable(model, target=TARGET)
    ids, mask = _prompt(False)
    fused = model.model._tileops.fused
    replay, fused.replay = fused.replay, None
    _, looped, tokens = _teacher_forced(model, ids, mask, steps=6)
    fused.replay = replay
    norm = hf._fused_model.rmsnorm_forward
    monkeypatch.setattr(hf._fused_model, "rmsnorm_forward", lambda module, x: norm(module, x.clone()))
    _, watched, _ = _teacher_forced(model, ids, mask, tokens, steps=6)
    assert torch.equal(watched, looped)
    assert replay.replays == 0 and replay.failed[2] == 3
    assert replay.refused[2].endswith("torch computed between the captured launches (a replay would skip it): "
                                      "aten.clone.default")


def test_a_replayed_step_is_as_checked_as_a_called_one():
    """A replay checks each launch as a call is checked, on what its tensors hold now: a
    position past the RoPE tables is refused at the replay, not read out of bounds."""
    model = _model("llama")
    hf.enable(model, target=TARGET)
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


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_threads_decoding_at_once_each_replay_their_own_graph(context):
    """Two threads generate on one enabled model at once, each with its own cache: each
    captures and replays a graph of its own (its own outputs) and gets the tokens it gets
    alone."""
    model = _model("llama")
    hf.enable(model, target=TARGET)
    prompts = [torch.randint(1, 128, (1, 10), generator=torch.Generator().manual_seed(s)) for s in (6, 7)]
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        alone = [model.generate(p, **kw) for p in prompts]
    replay = model.model._tileops.fused.replay
    before, together, start = replay.replays, [None, None], threading.Barrier(2)

    def run(i: int) -> None:
        start.wait()
        with CONTEXTS[context]():
            together[i] = model.generate(prompts[i], **kw)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(a, b) for a, b in zip(alone, together))
    assert replay.replays - before >= 2 * 20  # neither thread's recording displaced the other's


def test_replay_is_off_where_tileops_decode_replay_is_0(monkeypatch):
    monkeypatch.setenv("TILEOPS_DECODE_REPLAY", "0")
    model = _model("llama")
    hf.enable(model, target=TARGET)
    assert model.model._tileops.fused.replay is None


def _long_padded_prompt(arch: str, monkeypatch, *, length: int, pads: int, seed: int):
    """A model whose first pool holds 16 tokens past the prompt (so decoding grows it) and
    a batch of two prompts of `length` tokens, the first with `pads` left pads."""
    monkeypatch.setattr(hf._cache, "MIN_DECODE_ROOM", 16)
    model = _model(arch, max_position_embeddings=512)
    ids = torch.randint(1, 128, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return model, ids, mask


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


def test_an_unknown_architecture_is_refused_by_name():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(hf.UnsupportedModelError, match="GPT2LMHeadModel: architecture"):
        hf.enable(gpt2.to(torch.bfloat16).eval())
    phi2 = transformers.PhiForCausalLM(transformers.PhiConfig(**{k: COMMON[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")}))
    with pytest.raises(hf.UnsupportedModelError, match="PhiForCausalLM: architecture"):
        hf.enable(phi2.to(torch.bfloat16).eval())


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
    rope = {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}
    model = _model("llama", rope_parameters=rope)
    with pytest.raises(hf.UnsupportedModelError,
                       match=r"self_attn: rotary embedding \(rope_parameters rope_type='proportional'"):
        hf.enable(model, target=TARGET)
    report = hf.enable(model, target=TARGET, strict=False)
    assert report.count("attention") == 0 and model.config._attn_implementation != hf.ATTENTION_NAME


def test_partial_rotary_is_refused_where_transformers_cannot_apply_it_and_served_where_it_ignores_it():
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.5}
    model = _model("qwen3", rope_parameters=rope)
    with pytest.raises(hf.UnsupportedModelError, match=r"partial_rotary_factor=0.5 with rope_type='linear'"):
        hf.enable(model, target=TARGET)
    # the default RoPE of these architectures ignores the factor: its table is the whole head
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    model = _model("qwen3", rope_parameters=rope)
    assert model.model.rotary_emb.inv_freq.numel() * 2 == model.config.head_dim
    ids, mask = _prompt(True)
    ref = _teacher_forced(model, ids, mask, steps=2)
    hf.enable(model, target=TARGET)
    got = _teacher_forced(model, ids, mask, ref[2], steps=2)
    _close(got[0][mask.bool()], ref[0][mask.bool()], torch.bfloat16, "prefill")
    _close(got[1], ref[1], torch.bfloat16, "decode")


@pytest.mark.parametrize("kind", ["linear", "dynamic", "longrope", "llama3", "yarn"])
def test_each_rope_type_rotates_as_transformers_rotary_embedding(kind):
    """The op of each attention layer against transformers' own rotary module and
    apply_rotary_pos_emb, on a call within original_max_position_embeddings and one past
    it (LongRoPE's short and long factors), and on positions where the scaling matters.
    The factor on cos and sin (YaRN's, LongRoPE's) is folded into the attention scale."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

    arch = {"linear": "llama_linear", "longrope": "llama_longrope", "llama3": "llama31", "yarn": "llama_yarn"}
    arch = arch.get(kind, "llama")
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
    extra = {"rope_parameters": dynamic} if kind == "dynamic" else {}
    model = _model(arch, **extra)
    rotary = model.model.rotary_emb
    plain = _model("llama").model.rotary_emb
    hf.enable(model, target=TARGET)
    st = model.model.layers[0].self_attn._tileops
    rope = lambda x, pos: st.rope(x, pos) * st.rope_gain  # noqa: E731  (the gain is left to the attention scale)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(24, 4, 16, generator=gen).to(torch.bfloat16)  # [T, H, D]

    def rotated(x, cos, sin):  # transformers' apply_rotary_pos_emb on [T, H, D] as its [1, H, T, D]
        heads_first = x.transpose(0, 1)[None]
        return apply_rotary_pos_emb(heads_first, heads_first, cos, sin)[0][0].transpose(0, 1)

    for pos in (torch.arange(16), torch.arange(200, 224)):  # all within 16 (LongRoPE: short), then past it (long)
        xs = x[: pos.numel()].contiguous()
        want = rotated(xs, *rotary(xs, pos[None]))
        _close(rope(xs, pos), want, torch.bfloat16, f"{kind} at positions {int(pos[0])}..")
        if kind != "dynamic" and int(pos[0]) > 0:  # the scaling matters here: plain RoPE is far off
            assert (rotated(xs, *plain(xs, pos[None])).float() - want.float()).abs().max() > 0.5


@pytest.mark.parametrize("arch", ["llama_yarn", "llama_longrope"])
def test_the_factor_on_cos_and_sin_reaches_the_attention_scores(arch):
    """YaRN's and LongRoPE's factor on cos and sin (folded into the attention scale) on a
    model whose attention is sharp enough for it to matter: q and k projections x 8."""
    def sharp(attention_factor=None):
        rope = {**_config(arch).rope_parameters}
        if attention_factor is not None:
            rope["attention_factor"] = attention_factor
        model = _model(arch, rope_parameters=rope)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(8)
                layer.self_attn.k_proj.weight.mul_(8)
        return model

    model = sharp()
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=4)
    unscaled = _teacher_forced(sharp(1.0), ids, mask, tokens, steps=4)[0]
    atol, rtol = TOL[torch.bfloat16]
    assert (unscaled - ref_prefill)[mask.bool()].abs().max() > 5 * (atol + rtol * ref_prefill.abs().max())
    hf.enable(model, target=TARGET)
    assert model.model.layers[0].self_attn._tileops.rope_gain > 1.1
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, steps=4)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, f"{arch} prefill")
    _close(steps, ref_steps, torch.bfloat16, f"{arch} decode")


def test_dynamic_rope_past_max_position_embeddings_is_refused_at_the_call():
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    model = _model("llama", rope_parameters=rope, max_position_embeddings=16)
    hf.enable(model, target=TARGET)
    ids, mask = _prompt(False)
    with pytest.raises(ValueError, match=r"position 1\d is past max_position_embeddings=16 \(dynamic NTK"):
        _teacher_forced(model, ids, mask, steps=6)


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



@pytest.mark.skipif(SANITIZED, reason="tracing, not memory: left to the plain native suite")
@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_torch_compile_runs_the_enabled_forward_with_and_without_the_cache(context):
    """Graph breaks at the mask and cache bookkeeping (Python), the ops stay custom ops.
    Qwen3-MoE: a sparse block (router, experts through ExpertsInterface) and a dense MLP."""
    model = _model("qwen3_moe")
    hf.enable(model, target=TARGET)
    ids, mask = _prompt(True)
    compiled = torch.compile(model)
    with CONTEXTS[context]():
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
        # the keyword the model's forward names (transformers 5.24 renamed past_key_values to cache)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        passed = model.generate(ids, **{name: hf.TileopsCache(config=model.config)}, **kw)
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


# ---- Qwen3-MoE: the router and the experts ----------------------------------------------


ROUTERS = {  # (arch, config changes, renormalised, the weights' dtype)
    "qwen3-renormalised": ("qwen3_moe", {"norm_topk_prob": True}, True, torch.bfloat16),
    "qwen3": ("qwen3_moe", {"norm_topk_prob": False}, False, torch.bfloat16),
    "qwen2": ("qwen2_moe", {}, False, torch.bfloat16),
    "mixtral": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2}, True, torch.float32),
}


@pytest.mark.parametrize("router_kind", list(ROUTERS))
def test_the_router_selects_and_weighs_as_transformers_router_ties_included(router_kind):
    """FusedTopKOp against the router's own forward (Qwen3-MoE's, Qwen2-MoE's, Mixtral's):
    the same ids, and the same weights (renormalised or not; bfloat16, or float32 for
    Mixtral). Experts 3 and 5 have the same router row, so their logits tie on every token:
    where they meet at the k-th place, the pick is torch.topk's."""
    arch, extra, renormalised, dtype = ROUTERS[router_kind]
    model = _model(arch, **extra)
    router = model.model.layers[0].mlp.gate
    with torch.no_grad():
        router.weight[5] = router.weight[3]
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        want_logits, want_w, want_ids = type(router).forward(router, x)
        report = hf.enable(model, target=TARGET)
        logits, w, ids = router(x)
    assert report.count("moe router") >= 1 and "forward" in router.__dict__
    one_of_the_pair = (want_ids == 3).any(1) ^ (want_ids == 5).any(1)  # the tie sits at the k-th place
    assert int(one_of_the_pair.sum()) >= 3, "no tie at the k-th place: the test checked nothing"
    assert ids.dtype == want_ids.dtype and w.dtype == want_w.dtype == dtype
    # the same experts with the same weights (two tied ones both chosen may come in either order)
    mine, theirs = ids.sort(1), want_ids.sort(1)
    assert torch.equal(mine.values, theirs.values)
    torch.testing.assert_close(logits, want_logits, rtol=0.02, atol=0.02)
    torch.testing.assert_close(w.gather(1, mine.indices).float(), want_w.gather(1, theirs.indices).float(),
                               rtol=2**-8, atol=0)  # at most one bfloat16 step
    if renormalised:
        torch.testing.assert_close(w.float().sum(1), torch.ones(64), rtol=0.01, atol=0)


@pytest.mark.parametrize("tokens", [1, 3, 40])  # the op's decode path (<= 4 tokens) and its prefill path
def test_the_experts_run_the_routing_they_are_given(tokens):
    model = _model("qwen3_moe")
    experts = model.model.layers[0].mlp.experts
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 64, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(tokens)])
    w = torch.rand(tokens, 2, generator=gen).to(torch.bfloat16)
    w[0] = torch.tensor([1.0, 0.0])  # the ends of [0, 1]: a weight of one and a chosen expert of weight zero
    with torch.no_grad():
        want = experts(x, ids, w)  # eager: the reference's experts_implementation
        hf.enable(model, target=TARGET)
        assert model.config._experts_implementation == "tileops"
        got = experts(x, ids, w)
    _close(got, want, torch.bfloat16, f"experts on {tokens} tokens")
    # the routing reaches the op exactly: the same experts, the weights to float32 rounding
    from tileops import ops  # noqa: PLC0415

    got_w, got_ids = ops.FusedTopKOp(num_experts=8, top_k=2, scoring_func="sigmoid", target=TARGET)(
        hf._moe.routing_as_logits(ids, w, 8))
    order = got_ids.long().sort(1)
    assert torch.equal(order.values, ids.sort(1).values)
    torch.testing.assert_close(got_w.gather(1, order.indices), w.float().gather(1, ids.sort(1).indices),
                               rtol=1e-5, atol=1e-30)


def test_the_moe_block_weighs_in_the_logits_of_the_test_config():
    """Without its experts the reference's logits move far past the tolerance: the
    equivalence tests of qwen3_moe check the MoE path, not only what is around it."""
    model = _model("qwen3_moe")
    ids, mask = _prompt(False)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        model.model.layers[0].mlp.experts.down_proj.zero_()
        without = model(input_ids=ids, attention_mask=mask).logits
    atol, rtol = TOL[torch.bfloat16]
    assert (full - without).abs().max() > 10 * (atol + rtol * full.abs().max())


def test_an_unserved_experts_activation_is_refused_and_strict_false_keeps_it_on_torch():
    model = _model("qwen3_moe", hidden_act="relu")
    with pytest.raises(hf.UnsupportedModelError,
                       match=r"model.layers.0.mlp.experts: MoE experts \(config hidden_act='relu' \(served: silu, gelu"):
        hf.enable(model, target=TARGET)
    report = hf.enable(model, target=TARGET, strict=False)
    on_torch = [(m, f) for m, f, _ in report.on_torch]
    assert ("model.layers.0.mlp.experts", "MoE experts") in on_torch and ("model.layers.1.mlp", "gated MLP") in on_torch
    assert ("model.layers.0.mlp.gate", "MoE router") in on_torch and "forward" not in model.model.layers[0].mlp.gate.__dict__
    assert report.count("moe experts") == 0 and model.config._experts_implementation == "eager"
    ids, mask = _prompt(True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # what stays on torch still runs


def test_the_experts_name_alone_is_refused_on_a_model_enable_did_not_patch():
    model = _model("qwen3_moe")
    hf.enable(_model("qwen3_moe"), target=TARGET)  # registers "tileops" with transformers
    model.config._experts_implementation = "tileops"
    ids, mask = _prompt(False)
    with pytest.raises(RuntimeError, match="call enable"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, use_cache=False)


# ---- softcap and scale, which no served architecture passes today ------------------------


def test_the_attention_honours_softcap_and_scale_as_transformers_eager_attention_does():
    """Gemma 3 keeps attn_logit_softcapping in its config but transformers never passes it;
    a caller that does (transformers' softcap= keyword) gets it, prefill and decode."""
    from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward  # noqa: PLC0415

    model = _model("gemma3")
    attn = model.model.layers[1].self_attn  # a full-attention layer
    hf.enable(model, target=TARGET)
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, h, 13, 16, generator=gen).to(torch.bfloat16) for h in (4, 2, 2))
    causal = torch.full((13, 13), float("-inf")).triu(1).to(torch.bfloat16)[None, None]
    kw = dict(scaling=0.5, softcap=2.0)
    with torch.no_grad():
        want = eager_attention_forward(attn, q, k, v, causal, dropout=0.0, **kw)[0]  # [B, S, H, D]
        uncapped = eager_attention_forward(attn, q, k, v, causal, dropout=0.0, scaling=0.5)[0]
        cache = hf.TileopsCache(config=model.config)
        prefill = hf._attention.tileops_attention(attn, q[:, :, :12], k[:, :, :12], v[:, :, :12], None,
                                                  tileops_cache=cache, **kw)[0]
        decode = hf._attention.tileops_attention(attn, q[:, :, 12:], k[:, :, 12:], v[:, :, 12:], None,
                                                 tileops_cache=cache, **kw)[0]
    atol, rtol = TOL[torch.bfloat16]
    assert (want - uncapped).abs().max() > 10 * (atol + rtol * want.abs().max())  # the cap matters here
    _close(prefill, want[:, :12], torch.bfloat16, "softcapped prefill")
    _close(decode, want[:, 12:], torch.bfloat16, "softcapped decode")


def test_gemma3_final_logit_softcapping_stays_on_torch_and_matches():
    model = _model("gemma3", final_logit_softcapping=0.5)
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=4)
    report = hf.enable(model, target=TARGET)
    assert ("lm_head", "final logit softcapping") in [(m, f) for m, f, _ in report.on_torch]
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, steps=4)
    assert ref_prefill.abs().max() < 0.5  # tanh bounds them: the cap was applied
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, "capped prefill")
    _close(steps, ref_steps, torch.bfloat16, "capped decode")
