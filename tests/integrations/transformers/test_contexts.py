"""How people run a model: grad on, torch.no_grad and torch.inference_mode give eager's
logits and greedy tokens; torch.compile runs the enabled forward; threads decode on one
model at once.
"""

from __future__ import annotations

import threading

import pytest
import torch

from tileops.testing.agreement import check_greedy_agreement

from ._models import CONTEXTS, SANITIZED, STEPS, TOL, _close, _model, _prompt, _teacher_forced, hf


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3_moe"])
def test_every_grad_context_gives_eagers_logits_and_greedy_tokens(arch, context, target):
    """Plain (grad on), torch.no_grad and torch.inference_mode: the same logits at prefill
    and each decode step, and generate's greedy tokens (its search in C++ where served)."""
    model = _model(arch)
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask)
    hf.enable(model, target=target)
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, context=CONTEXTS[context])
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, f"{arch} prefill under {context}")
    _close(steps, ref_steps, torch.bfloat16, f"{arch} decode under {context}")
    with CONTEXTS[context]():
        got = model.generate(ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    atol, rtol = TOL[torch.bfloat16]
    check_greedy_agreement(
        ref_steps, tokens, got[:, ids.shape[1] :], atol + rtol * float(ref_steps.float().abs().max())
    )


@pytest.mark.skipif(SANITIZED, reason="tracing, not memory: left to the unsanitized runs")
@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_torch_compile_runs_the_enabled_forward_with_and_without_the_cache(context, target):
    """Graph breaks at the mask and cache bookkeeping (Python), the ops stay custom ops.
    Qwen3-MoE: a sparse block (router, experts through ExpertsInterface) and a dense MLP."""
    model = _model("qwen3_moe")
    hf.enable(model, target=target)
    ids, mask = _prompt(True)
    compiled = torch.compile(model)
    with CONTEXTS[context]():
        for use_cache in (False, True):
            want = model(input_ids=ids, attention_mask=mask, use_cache=use_cache).logits
            got = compiled(input_ids=ids, attention_mask=mask, use_cache=use_cache).logits
            assert torch.equal(got[mask.bool()], want[mask.bool()])


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_threads_decoding_at_once_each_replay_their_own_graph(context, target):
    """Two threads generate on one enabled model at once, each with its own cache: each
    captures and replays a graph of its own (its own outputs) and gets the tokens it gets
    alone."""
    model = _model("llama")
    hf.enable(model, target=target)
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
