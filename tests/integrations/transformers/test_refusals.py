"""What cannot be served is refused by name, never served wrong: at enable (module,
feature and config value named; strict=False keeps those parts on torch and lists them)
or at the call (positions past the tables, right padding, another class's cache, the
attention or experts name on a model enable did not patch).
"""

from __future__ import annotations

import pytest
import torch

from ._models import (
    COMMON,
    _cache,
    _cache_kw,
    _close,
    _model,
    _prompt,
    _teacher_forced,
    hf,
    transformers,
)


def test_a_float32_model_is_refused_with_the_dtype_to_load_with(target):
    model = _model("llama", torch.float32)
    with pytest.raises(hf.UnsupportedModelError, match=r"torch.float32.*torch_dtype=torch.bfloat16"):
        hf.enable(model, target=target)
    assert "forward" not in model.model.layers[0].self_attn.__dict__  # nothing was patched


def test_an_unknown_architecture_is_refused_by_name():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(hf.UnsupportedModelError, match="GPT2LMHeadModel: architecture"):
        hf.enable(gpt2.to(torch.bfloat16).eval())
    phi2 = transformers.PhiForCausalLM(
        transformers.PhiConfig(
            **{
                k: COMMON[k]
                for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            }
        )
    )
    with pytest.raises(hf.UnsupportedModelError, match="PhiForCausalLM: architecture"):
        hf.enable(phi2.to(torch.bfloat16).eval())


def test_an_unserved_activation_names_module_feature_and_value_and_strict_false_lists_it(target):
    model = _model("llama", hidden_act="relu")
    with pytest.raises(hf.UnsupportedModelError, match=r"model.layers.0.mlp: gated MLP \(config hidden_act='relu'"):
        hf.enable(model, target=target)
    report = hf.enable(model, target=target, strict=False)
    assert ("model.layers.0.mlp", "gated MLP") in [(m, f) for m, f, _ in report.on_torch]
    assert report.count("mlp") == 0 and report.count("attention") == 2
    ids, mask = _prompt(True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # what stays on torch still runs


def test_an_unserved_rope_scaling_is_refused_and_keeps_attention_on_torch_when_not_strict(target):
    rope = {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}
    model = _model("llama", rope_parameters=rope)
    with pytest.raises(
        hf.UnsupportedModelError, match=r"self_attn: rotary embedding \(rope_parameters rope_type='proportional'"
    ):
        hf.enable(model, target=target)
    report = hf.enable(model, target=target, strict=False)
    assert report.count("attention") == 0 and model.config._attn_implementation != hf.ATTENTION_NAME


def test_partial_rotary_is_refused_where_transformers_cannot_apply_it_and_served_where_it_ignores_it(target):
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.5}
    model = _model("qwen3", rope_parameters=rope)
    with pytest.raises(hf.UnsupportedModelError, match=r"partial_rotary_factor=0.5 with rope_type='linear'"):
        hf.enable(model, target=target)
    # the default RoPE of these architectures ignores the factor: its table is the whole head
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    model = _model("qwen3", rope_parameters=rope)
    assert model.model.rotary_emb.inv_freq.numel() * 2 == model.config.head_dim
    ids, mask = _prompt(True)
    ref = _teacher_forced(model, ids, mask, steps=2)
    hf.enable(model, target=target)
    got = _teacher_forced(model, ids, mask, ref[2], steps=2)
    _close(got[0][mask.bool()], ref[0][mask.bool()], torch.bfloat16, "prefill")
    _close(got[1], ref[1], torch.bfloat16, "decode")


def test_dynamic_rope_past_max_position_embeddings_is_refused_at_the_call(target):
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    model = _model("llama", rope_parameters=rope, max_position_embeddings=16)
    hf.enable(model, target=target)
    ids, mask = _prompt(False)
    with pytest.raises(ValueError, match=r"position 1\d is past max_position_embeddings=16 \(dynamic NTK"):
        _teacher_forced(model, ids, mask, steps=6)


def test_a_training_mode_model_and_a_second_enable_are_refused(target):
    model = _model("llama").train()
    with pytest.raises(hf.UnsupportedModelError, match="training mode"):
        hf.enable(model, target=target)
    model.eval()
    hf.enable(model, target=target)
    with pytest.raises(hf.UnsupportedModelError, match="already enabled"):
        hf.enable(model, target=target)


def test_a_position_past_max_position_embeddings_is_refused_even_in_a_reused_tensor(target):
    model = _model("llama", max_position_embeddings=16)
    hf.enable(model, target=target)
    ids = torch.randint(1, 128, (1, 4))
    pos = torch.arange(4)[None]
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos)  # every layer checks this tensor once
        pos[0, -1] = 16  # the same tensor, changed in place
        with pytest.raises(ValueError, match="position 16 is past max_position_embeddings=16"):
            model(input_ids=ids, position_ids=pos)


def test_right_padding_is_refused_at_the_call_not_served_wrong(target):
    model = _model("llama")
    hf.enable(model, target=target)
    ids, mask = _prompt(False)
    mask[1, -3:] = 0
    with pytest.raises(ValueError, match="left padding only"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def test_the_attention_name_alone_is_refused_on_a_model_enable_did_not_patch(target):
    model = _model("llama")
    hf.enable(_model("llama"), target=target)  # registers "tileops" with transformers
    model.config._attn_implementation = hf.ATTENTION_NAME
    ids, mask = _prompt(False)
    with pytest.raises(RuntimeError, match="call enable"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, use_cache=False)


def test_a_cache_of_another_class_with_tokens_in_it_is_refused(target):
    model = _model("llama")
    ids, mask = _prompt(False)
    with torch.no_grad():
        dynamic = _cache(model(input_ids=ids, attention_mask=mask, use_cache=True))
        hf.enable(model, target=target)
        with pytest.raises(TypeError, match="reads a TileopsCache, got DynamicCache"):
            model(
                input_ids=ids[:, :1],
                attention_mask=torch.cat([mask, mask[:, :1]], 1),
                use_cache=True,
                **{_cache_kw(model): dynamic},
            )


def test_an_unserved_experts_activation_is_refused_and_strict_false_keeps_it_on_torch(target):
    model = _model("qwen3_moe", hidden_act="relu")
    with pytest.raises(
        hf.UnsupportedModelError,
        match=r"model.layers.0.mlp.experts: MoE experts \(config hidden_act='relu' \(served: silu, gelu",
    ):
        hf.enable(model, target=target)
    report = hf.enable(model, target=target, strict=False)
    on_torch = [(m, f) for m, f, _ in report.on_torch]
    assert ("model.layers.0.mlp.experts", "MoE experts") in on_torch and ("model.layers.1.mlp", "gated MLP") in on_torch
    assert ("model.layers.0.mlp.gate", "MoE router") in on_torch and "forward" not in model.model.layers[
        0
    ].mlp.gate.__dict__
    assert report.count("moe experts") == 0 and model.config._experts_implementation == "eager"
    ids, mask = _prompt(True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # what stays on torch still runs


def test_the_experts_name_alone_is_refused_on_a_model_enable_did_not_patch(target):
    model = _model("qwen3_moe")
    hf.enable(_model("qwen3_moe"), target=target)  # registers "tileops" with transformers
    model.config._experts_implementation = "tileops"
    ids, mask = _prompt(False)
    with pytest.raises(RuntimeError, match="call enable"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, use_cache=False)
