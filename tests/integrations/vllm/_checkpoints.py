"""Tiny random checkpoints the vLLM tests write, one per architecture the plugin must serve.

Weights are drawn with a larger spread than the configs' default (initializer_range 0.3):
the default's near-uniform logits leave almost every greedy step a tie, and the agreement
rule would then compare next to nothing.
"""

from __future__ import annotations

import pathlib

COMMON = dict(
    vocab_size=1000,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.3,
    tie_word_embeddings=False,
)

# name -> (transformers classes, config overrides)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    # a window shorter than the long prompt, so attention must drop keys
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 24}),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "head_dim": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "norm_topk_prob": True,
        },
    ),
}


def write(arch: str, folder: pathlib.Path) -> pathlib.Path:
    """Writes ``arch``'s checkpoint (bfloat16 safetensors) to ``folder``; returns it."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder
