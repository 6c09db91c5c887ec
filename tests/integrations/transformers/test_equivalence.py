"""Each served architecture, on a tiny random config, enabled on each CPU target gives HF
eager's logits at prefill and at each of 16 decode steps, with and without left padding
(bfloat16, and float16 within its own tolerance); greedy generate agrees while the
reference is sure, sampling runs; disable gives back HF's outputs bit for bit; a
checkpoint save_pretrained wrote loads enabled; the softcaps Gemma 3 keeps are honoured.
"""

from __future__ import annotations

import pytest
import torch

from tileops.testing.agreement import check_greedy_agreement

from ._models import ARCHS, COUNTS, STEPS, TOL, _close, _model, _prompt, _teacher_forced, hf


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_eager_at_prefill_and_every_decode_step(arch, padded, target):
    dtype = torch.bfloat16
    model = _model(arch, dtype)
    ids, mask = _prompt(padded)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    report = hf.enable(model, target=target)
    want = {"attention": 2, "mlp": 2, "linear": 2 * 7 + 1, **COUNTS.get(arch, {})}
    assert {kind: report.count(kind) for kind in want} == want and report.count("rmsnorm") >= 5
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens)
    real = mask.bool()
    _close(prefill[real], ref_prefill[real], dtype, f"{arch} prefill")
    for t in range(STEPS):
        _close(steps[t], ref_steps[t], dtype, f"{arch} decode step {t}")


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3_moe"])
def test_float16_logits_match_eager_within_its_tolerance(arch, target):
    model = _model(arch, torch.float16)
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    hf.enable(model, target=target)
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.float16, f"{arch} prefill")
    _close(steps, ref_steps, torch.float16, f"{arch} decode")


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_agrees_while_the_reference_is_sure(arch, target):
    model = _model(arch)
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
        hf.enable(model, target=target)
        got = model.generate(ids, **kw)
    ref_logits = torch.stack(ref.logits)  # [steps, B, V]
    atol, rtol = TOL[torch.bfloat16]
    tol = atol + rtol * float(ref_logits.float().abs().max())
    confident = check_greedy_agreement(ref_logits, ref.sequences[:, ids.shape[1] :], got[:, ids.shape[1] :], tol)
    assert max(confident) > 0, "the reference was never sure: the test checked nothing"


def test_sampling_generate_runs_and_keeps_the_prompt(target):
    model = _model("qwen3")
    ids, mask = _prompt(True)
    hf.enable(model, target=target)
    torch.manual_seed(3)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, pad_token_id=0)
    assert out.shape == (2, ids.shape[1] + 6) and torch.equal(out[:, : ids.shape[1]], ids)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3", "qwen3_moe"])
def test_disable_gives_back_eager_outputs_bit_for_bit(arch, target):
    model = _model(arch)
    ids, mask = _prompt(True)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        hf.enable(model, target=target)
        model(input_ids=ids, attention_mask=mask)
        hf.disable(model)
        assert model.config._attn_implementation == "eager" and model.config._experts_implementation == "eager"
        assert not any("forward" in m.__dict__ or "_tileops" in m.__dict__ for m in model.modules())
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)
        again = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(again, generated)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3_moe"])
def test_the_loader_enables_a_checkpoint_that_save_pretrained_wrote(tmp_path, arch, target):
    model = _model(arch)
    model.save_pretrained(tmp_path)
    ids, mask = _prompt(False)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        loaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, target=target)
        assert loaded.tileops_report.count("attention") == 2 and not loaded.training
        got = loaded(input_ids=ids, attention_mask=mask).logits
    _close(got, ref, torch.bfloat16, "loaded checkpoint")


# ---- softcap and scale, which no served architecture passes today ------------------------


def test_the_attention_honours_softcap_and_scale_as_transformers_eager_attention_does(target):
    """Gemma 3 keeps attn_logit_softcapping in its config but transformers never passes it;
    a caller that does (transformers' softcap= keyword) gets it, prefill and decode."""
    from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward  # noqa: PLC0415

    model = _model("gemma3")
    attn = model.model.layers[1].self_attn  # a full-attention layer
    hf.enable(model, target=target)
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, h, 13, 16, generator=gen).to(torch.bfloat16) for h in (4, 2, 2))
    causal = torch.full((13, 13), float("-inf")).triu(1).to(torch.bfloat16)[None, None]
    kw = dict(scaling=0.5, softcap=2.0)
    with torch.no_grad():
        want = eager_attention_forward(attn, q, k, v, causal, dropout=0.0, **kw)[0]  # [B, S, H, D]
        uncapped = eager_attention_forward(attn, q, k, v, causal, dropout=0.0, scaling=0.5)[0]
        cache = hf.TileopsCache(config=model.config)
        prefill = hf.attention.tileops_attention(
            attn, q[:, :, :12], k[:, :, :12], v[:, :, :12], None, tileops_cache=cache, **kw
        )[0]
        decode = hf.attention.tileops_attention(
            attn, q[:, :, 12:], k[:, :, 12:], v[:, :, 12:], None, tileops_cache=cache, **kw
        )[0]
    atol, rtol = TOL[torch.bfloat16]
    assert (want - uncapped).abs().max() > 10 * (atol + rtol * want.abs().max())  # the cap matters here
    _close(prefill, want[:, :12], torch.bfloat16, "softcapped prefill")
    _close(decode, want[:, 12:], torch.bfloat16, "softcapped decode")


def test_gemma3_final_logit_softcapping_stays_on_torch_and_matches(target):
    model = _model("gemma3", final_logit_softcapping=0.5)
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=4)
    report = hf.enable(model, target=target)
    assert ("lm_head", "final logit softcapping") in [(m, f) for m, f, _ in report.on_torch]
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, steps=4)
    assert ref_prefill.abs().max() < 0.5  # tanh bounds them: the cap was applied
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, "capped prefill")
    _close(steps, ref_steps, torch.bfloat16, "capped decode")
