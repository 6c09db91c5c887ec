"""The demo's model: a Hugging Face Llama built from examples/llama-155m/config.json with
random weights (nothing is downloaded), and a byte-level tokenizer that needs no files."""

from __future__ import annotations

import pathlib
import time

import torch

CONFIG = pathlib.Path(__file__).parent / "llama-155m" / "config.json"
PROMPT = (
    "tileops runs the ops of a Hugging Face model on the kernels of whatever backend is "
    "installed; this prompt is the demo's."
)


class ByteTokenizer:
    """UTF-8 bytes as token ids 3..258 after bos (1); 0 pads: any text, no vocabulary file."""

    offset = 3

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([[1, *(b + self.offset for b in text.encode())]])


def load() -> torch.nn.Module:
    import transformers  # noqa: PLC0415 (the demo's only transformers user)

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig.from_json_file(CONFIG)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    # Random weights may emit the end-of-sequence token; the demo decodes every token it
    # asks for. (min_new_tokens would too, at two vocabulary-wide torch.isin per step.)
    model.generation_config.eos_token_id = None
    return model


@torch.no_grad()
def generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, list[torch.Tensor], float, float]:
    """Greedy tokens and logits of `new` steps, with prefill tok/s and decode tok/s timed
    apart: the prefill is generate of the first token, the decode is generate resumed from
    its cache for the other new - 1. (Generate of `new` minus generate of 1 would put the
    difference of two prefills into the decode figure.)"""
    kw = dict(do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    start = time.perf_counter()
    first = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, **kw)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    cache = "cache" if "cache" in first else "past_key_values"  # the name before transformers 5.24
    rest = model.generate(first.sequences, attention_mask=torch.ones_like(first.sequences),
                          **{cache: first[cache]}, max_new_tokens=new - 1, **kw)
    decode = time.perf_counter() - start
    return rest.sequences[0, ids.shape[1]:], [*first.logits, *rest.logits], ids.shape[1] / prefill, (new - 1) / decode
