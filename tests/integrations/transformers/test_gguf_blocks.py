"""The real model's GGUF file kept in its GGML blocks (``load_gguf``; docs/quantized.md),
and a bf16 model's Linears quantized once (``enable(weights="int8")``).

The reference for the blocks is the file's own weights: the same model loaded in float32,
unenabled, each GgufLinear dequantizing its blocks exactly (no bf16 rounding of the
weights, which transformers' loader does and the kernels do not). The enabled bf16 model
reads those blocks; its perplexity is the reference's within 1 % and its greedy answer the
reference's wherever the reference is sure.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tileops.quant import ggml_blocks
from tileops.testing.agreement import check_greedy_agreement

from ._models import hf, transformers
from ._real_model import GGUF, chat_ids, require_the_model, text_ids

require_the_model()
gguf = pytest.importorskip("gguf")

QUESTION = "What is the capital of France? Answer in one sentence."
NEW = 16
TOKENS = 1024  # of the text, for perplexities (over 512 they move by 1.4 %: too few to compare int8 with bf16)


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def blocks():
    """The file loaded with its blocks kept, bf16 elsewhere; unenabled."""
    return hf.load_gguf(GGUF.parent, GGUF.name)


@pytest.fixture(scope="module")
def exact(tokenizer):
    """(the file's weights in float32, unenabled; its greedy answer: prompt ids, new tokens
    [1, n], logits [n, 1, vocab])."""
    model = hf.load_gguf(GGUF.parent, GGUF.name, dtype=torch.float32)
    ids = chat_ids(tokenizer, QUESTION)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=NEW, do_sample=False, output_logits=True, return_dict_in_generate=True)
    return model, (ids, out.sequences[:, ids.shape[1] :], torch.stack(out.logits))


@pytest.fixture(scope="module")
def enabled(blocks, target):
    model = copy.deepcopy(blocks)
    report = hf.enable(model, target=target)
    assert report.count("embedding") == 1 and report.count("linear") == 211
    assert not any("embedding lookup" in feature for _, feature, _ in report.on_torch)
    return model


def _perplexity(model, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).exp())


def _linears(model) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, hf.GgufLinear))}


def test_every_quantized_matrix_stays_in_the_files_blocks(blocks):
    reader = gguf.GGUFReader(GGUF)
    file_types = {t.name: ggml_blocks.ggml_type(int(t.tensor_type)).name for t in reader.tensors}
    linears = _linears(blocks)
    assert len(linears) == 211 and all(type(m) is hf.GgufLinear for m in linears.values())
    down = {t.name: t for t in reader.tensors}["blk.0.ffn_down.weight"]  # rows as stored (no reordering)
    layer = blocks.model.layers[0]
    assert layer.mlp.down_proj.ggml_type == file_types["blk.0.ffn_down.weight"]
    assert torch.equal(layer.mlp.down_proj.weight_blocks, torch.from_numpy(down.data.copy()).view(torch.uint8))
    embed = blocks.get_input_embeddings()
    assert type(embed) is hf.GgufEmbedding and embed.ggml_type == file_types["token_embd.weight"]
    # the tied head reads the embedding's blocks, not a copy
    assert blocks.lm_head.weight_blocks.data_ptr() == embed.weight_blocks.data_ptr()
    held = {t.data_ptr(): t.numel() * t.element_size() for t in [*blocks.parameters(), *blocks.buffers()]}
    assert sum(held.values()) <= 1.25 * GGUF.stat().st_size


def test_unenabled_it_computes_transformers_dequantized_model(blocks):
    eager = transformers.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314, 7042, 30]])
    with torch.inference_mode():
        assert torch.equal(blocks(ids).logits, eager.eval()(ids).logits)


def test_perplexity_is_the_files_weights_within_one_percent(enabled, exact, tokenizer):
    ids = text_ids(tokenizer, TOKENS)
    want, got = _perplexity(exact[0], ids), _perplexity(enabled, ids)
    assert want < 60, f"the file's perplexity {want:.2f}: not the trained model"
    assert abs(got / want - 1) < 0.01, f"perplexity: tileops over the blocks {got:.3f}, the file's weights {want:.3f}"


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_greedy_answer_is_the_files_and_its_steps_run_in_cpp(enabled, exact, tokenizer, context):
    ids, ref_tokens, ref_logits = exact[1]
    replay = enabled.model._tileops.fused.replay
    searched = replay.searched
    with getattr(torch, context)():
        out = enabled.generate(ids, max_new_tokens=NEW, do_sample=False)
    tokens = out[:, ids.shape[1] :]
    n = min(tokens.shape[1], ref_tokens.shape[1])
    tol = 0.004 + 0.02 * float(ref_logits.abs().max())  # bf16 activations against float32
    confident = check_greedy_agreement(ref_logits[:n], ref_tokens[:, :n], tokens[:, :n], tol)
    assert confident[0] >= 4, "the reference was hardly sure: the test checked little"
    assert "Paris" in tokenizer.decode(tokens[0])
    assert replay.searched > searched  # the loop in C++ fed the step its token ids


def test_from_pretrained_keeps_the_blocks_or_dequantizes_when_asked(target):
    kept = hf.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, target=target)
    assert type(kept.lm_head) is hf.GgufLinear and kept.tileops_report.count("embedding") == 1
    assert next(kept.model.norm.parameters()).dtype == torch.bfloat16  # the default activations' dtype
    dense = hf.AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, target=target, dequantize=True, dtype=torch.bfloat16
    )
    assert type(dense.lm_head) is nn.Linear and dense.lm_head.weight.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="keyword arguments only"):
        hf.AutoModelForCausalLM.from_pretrained(GGUF.parent, "extra", gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def bf16():
    eager = transformers.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.bfloat16)
    return eager.eval()


def test_int8_weights_keep_bf16s_perplexity_and_disable_gives_the_linears_back(bf16, target, tokenizer):
    ids = text_ids(tokenizer, TOKENS)
    dense = copy.deepcopy(bf16)
    hf.enable(dense, target=target)  # the same kernels but the GEMMs': only the weights differ
    model = copy.deepcopy(bf16)
    before = _linears(model)
    report = hf.enable(model, target=target, weights="int8")
    assert len(report.replaced["int8 weights (Q8_0 blocks)"]) == 211
    assert all(type(m) is hf.GgufLinear and m.ggml_type == "Q8_0" for m in _linears(model).values())
    want, got = _perplexity(dense, ids), _perplexity(model, ids)
    assert abs(got / want - 1) < 0.005, f"perplexity: int8 weights {got:.3f}, bf16 weights {want:.3f}"
    hf.disable(model)
    after = _linears(model)
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    with torch.inference_mode():
        assert torch.equal(model(ids[:, :16]).logits, bf16(ids[:, :16]).logits)


def test_unknown_weight_formats_and_malformed_blocks_are_named(bf16):
    with pytest.raises(ValueError, match="weights must be None or one of \\['int8'\\], got 'int4'"):
        hf.enable(copy.deepcopy(bf16), weights="int4")
    with pytest.raises(ValueError, match="expected uint8 rows of 40 bytes \\(64 Q4_1 weights\\)"):
        hf.GgufLinear(torch.zeros(8, 35, dtype=torch.uint8), "Q4_1", 64)
