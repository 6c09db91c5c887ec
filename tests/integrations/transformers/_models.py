"""What the model tests share: the tiny random configs of each served architecture, the
reference model (transformers' eager attention and eager experts loop), the prompts, the
teacher-forced decode every equivalence test compares, and its tolerances.

A test that runs a model on a backend takes the ``target`` fixture (conftest.py): it runs
once on each CPU target, native_cpu's C++ kernels and torch_cpu's PyTorch ones
(backends/example).
"""

from __future__ import annotations

import contextlib
import inspect
import os

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install tileops[transformers])"
)
hf = pytest.importorskip("tileops.integrations.transformers")

STEPS = 16
# |enabled - eager| <= ATOL + RTOL * max|eager logits| per step. Measured on these configs:
# at most 0.009 (bf16, Gemma 3) and 0.0011 (fp16) against logits up to 0.63, i.e. one or
# two ulps of the logits' own dtype; the bounds leave about 2x.
TOL = {torch.bfloat16: (0.004, 0.02), torch.float16: (0.001, 0.003)}

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    pad_token_id=0,
)


def _config(arch: str, **extra):
    c = transformers
    if arch == "llama":
        return c.LlamaConfig(**{**COMMON, **extra})
    if arch == "llama31":  # llama3 RoPE scaling
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return c.LlamaConfig(**{**COMMON, "rope_parameters": rope, **extra})
    if arch == "llama_yarn":  # YaRN RoPE scaling, with its own betas and attention factor
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "attention_factor": 1.3,
        }
        return c.LlamaConfig(**{**COMMON, "rope_parameters": rope, **extra})
    if arch == "llama_linear":  # linear RoPE scaling (every frequency / factor)
        return c.LlamaConfig(
            **{**COMMON, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5}, **extra}
        )
    if arch == "llama_longrope":  # LongRoPE: short factors up to position 16, long ones for a call past it
        return c.LlamaConfig(**{**COMMON, "rope_parameters": LONGROPE, **extra})
    if arch == "mistral":  # a window shorter than the prompts
        return c.MistralConfig(**{**COMMON, "sliding_window": 8, **extra})
    if arch == "qwen2":  # q/k/v biases
        return c.Qwen2Config(**{**COMMON, **extra})
    if arch == "qwen3":  # q/k norm
        return c.Qwen3Config(**{**COMMON, **extra})
    if arch == "gemma3":  # local (window 8, theta 1e4) and global (theta 1e6) layers, 1 + w norms, scale
        return c.Gemma3TextConfig(
            **{
                **COMMON,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
                "query_pre_attn_scalar": 24,
                "hidden_activation": "gelu_pytorch_tanh",
                **extra,
            }
        )
    if arch == "qwen3_moe":  # layer 0 a sparse block (8 experts, top 2, renormalised), layer 1 a dense MLP
        return c.Qwen3MoeConfig(
            **{
                **COMMON,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "norm_topk_prob": True,
                "mlp_only_layers": [1],
                **extra,
            }
        )
    if arch == "phi3":  # stacked qkv_proj and gate_up_proj; half of each head rotates
        return c.Phi3Config(
            **{
                **COMMON,
                **TOKENS,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                **extra,
            }
        )
    if arch == "phi3_longrope":  # LongRoPE on half of each head (long factors past position 16), a window of 8
        return c.Phi3Config(
            **{
                **COMMON,
                **TOKENS,
                "original_max_position_embeddings": 16,
                "sliding_window": 8,
                "rope_parameters": PHI3_LONGROPE,
                **extra,
            }
        )
    if arch == "mixtral":
        # every layer a sparse block (float32 routing weights, always renormalised). The second
        # layer's routing reads the first's rounding, and with random weights a token's k-th and
        # k+1-th experts can be a rounding apart: every expert weighs in (top 4 of 4), so the
        # reference has no such choice to flip. The selection itself is tested on the router
        # alone (test_the_router_selects_and_weighs_as_transformers_router_ties_included).
        return c.MixtralConfig(**{**COMMON, "num_local_experts": 4, "num_experts_per_tok": 4, **extra})
    if arch == "qwen2_moe":  # layer 0 a sparse block with a shared expert and its sigmoid gate, layer 1 a dense MLP
        return c.Qwen2MoeConfig(
            **{
                **COMMON,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 64,
                "norm_topk_prob": False,
                "mlp_only_layers": [1],
                **extra,
            }
        )
    if arch == "granite":  # its four multipliers
        return c.GraniteConfig(
            **{
                **COMMON,
                **TOKENS,
                "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22,
                "attention_multiplier": 0.2,
                "logits_scaling": 8.0,
                **extra,
            }
        )
    if arch == "olmo2":  # norms after attention and the MLP, q/k norms over whole projections
        return c.Olmo2Config(**{**COMMON, **TOKENS, **extra})
    raise KeyError(arch)


LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 16,
    "factor": 4.0,
    "short_factor": [1.0 + 0.1 * i for i in range(8)],
    "long_factor": [1.0 + 0.9 * i for i in range(8)],
}
PHI3_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "short_factor": [1.0, 1.1, 1.2, 1.3],
    "long_factor": [2.0, 3.0, 4.0, 5.0],
}
TOKENS = dict(bos_token_id=1, eos_token_id=2)  # within the vocabulary of 128, as Llama's defaults are
ARCHS = [
    "llama",
    "llama31",
    "llama_yarn",
    "llama_linear",
    "llama_longrope",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "qwen3_moe",
    "phi3",
    "phi3_longrope",
    "mixtral",
    "qwen2_moe",
    "granite",
    "olmo2",
]
# The sanitizer job (tools/sanitize.sh, which sets ASAN_OPTIONS) runs the per-architecture
# tests on native_cpu alone (its C++ kernels are what the job instruments), on the configs
# that between them reach every kernel and every kind of call the ten make (Llama 3.1's and
# LongRoPE's RoPE ops, Qwen2's bias, Qwen3's q/k norm, Gemma 3's sandwich, GELU-tanh and
# window, the MoE ops), and leaves torch.compile out (it checks TorchDynamo's tracing, not
# memory): the job's time is CI's largest share.
SANITIZED = "ASAN_OPTIONS" in os.environ
if SANITIZED:
    ARCHS = ["llama31", "llama_longrope", "qwen2", "qwen3", "gemma3", "qwen3_moe"]
TARGETS = ["native_cpu"] if SANITIZED else ["native_cpu", "torch_cpu"]
# what enable replaces on these 2-layer configs, where it is not 2 attentions, 2 gated MLPs, 2 x 7 + 1 linears
# (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj; Qwen2-MoE: a dense MLP, then a shared expert
# and its gate beside the routed experts)
COUNTS = {
    "qwen3_moe": {"mlp": 1, "moe experts": 1, "moe router": 1, "linear": 2 * 4 + 3 + 1},
    "phi3": {"linear": 2 * 4 + 1},
    "phi3_longrope": {"linear": 2 * 4 + 1},
    "mixtral": {"mlp": 0, "moe experts": 2, "moe router": 2, "linear": 2 * 4 + 1},
    "qwen2_moe": {"mlp": 2, "moe experts": 1, "moe router": 1, "linear": 2 * 4 + 3 + 3 + 1 + 1},
}


def _model(arch: str, dtype: torch.dtype = torch.bfloat16, **extra):
    torch.manual_seed(0)
    # the reference: transformers' eager attention and eager experts loop, made in `dtype` as
    # from_pretrained(dtype=) makes it (RoPE frequencies stay float32; .to(dtype) would round them)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(arch, **extra), dtype=dtype, attn_implementation="eager", experts_implementation="eager"
    )
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


def _long_padded_prompt(arch: str, monkeypatch, *, length: int, pads: int, seed: int):
    """A model whose first pool holds 16 tokens past the prompt (so decoding grows it) and
    a batch of two prompts of `length` tokens, the first with `pads` left pads."""
    monkeypatch.setattr(hf.cache, "MIN_DECODE_ROOM", 16)
    model = _model(arch, max_position_embeddings=512)
    ids = torch.randint(1, 128, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return model, ids, mask


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
