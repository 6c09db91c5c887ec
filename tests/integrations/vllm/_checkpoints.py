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


def write_real(folder: pathlib.Path) -> pathlib.Path:
    """SmolLM2-135M-Instruct, the trained model of the tests (its Q4_1 GGUF file, `make
    model`), as vLLM loads a checkpoint: transformers dequantizes it to bfloat16, saved as
    safetensors with its tokenizer and chat template. About 300 MB, a few seconds."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # noqa: PLC0415

    from ..transformers._real_model import GGUF, require_the_model  # noqa: PLC0415

    require_the_model()
    if (folder / "config.json").is_file():
        return folder
    model = AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
    )
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name).save_pretrained(folder)
    return folder
