"""GPTQ and AWQ 4-bit checkpoints load into GemmW4A16FwdOp's layout (``load_int4``, which
``from_pretrained`` calls; docs/quantized.md).

The checkpoints are written here (``_int4_checkpoints.py``, packed from the formats'
description, not by tileops) from a tiny random Llama: GPTQ v1 asymmetric in groups of 32,
GPTQ v1 symmetric with one group per row and ``desc_act`` set (its g_idx in K order), AWQ
GEMM in groups of 64 with a tied head. The reference is transformers' model over the
weights the writer quantized, in float32 (those weights exactly); enabled in bfloat16 it
agrees within the tolerance the other model tests use (``_models.TOL``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tileops.quant import int4
from tileops.testing.agreement import check_greedy_agreement

from ._int4_checkpoints import edit_checkpoint, write_checkpoint
from ._models import STEPS, TOL, _close, _model, _prompt, _teacher_forced, hf

GROUPS = {"gptq-asym": 32, "gptq-sym": -1, "awq": 64}  # -1: one group per row


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """layout -> (its folder, the bf16 model it was written from, the weights it holds by Linear name)."""
    written = {}
    for layout, group in GROUPS.items():
        model = _model("llama", tie_word_embeddings=layout == "awq")  # the AWQ file holds no head: tied
        folder = tmp_path_factory.mktemp(layout)
        written[layout] = folder, model, write_checkpoint(model, folder, layout, group)
    return written


@pytest.fixture(params=list(GROUPS))
def checkpoint(request, checkpoints):
    return checkpoints[request.param]


def _over(model: nn.Module, weights: dict, dtype: torch.dtype) -> nn.Module:
    """transformers' model (eager attention) with each quantized Linear's weight the
    checkpoint's, in ``dtype`` (a bf16 model is not converted: .to() would round its RoPE
    frequencies)."""
    ref = copy.deepcopy(model)
    ref = ref if dtype == torch.bfloat16 else ref.to(dtype)
    with torch.no_grad():
        for name, w in weights.items():
            ref.get_submodule(name).weight.copy_(w)
    return ref


def test_each_quantized_linear_holds_exactly_the_weights_the_checkpoint_was_written_with(checkpoint):
    folder, model, weights = checkpoint
    loaded = hf.load_int4(folder)
    w4 = {n: m for n, m in loaded.named_modules() if type(m) is hf.W4A16Linear}
    assert w4.keys() == weights.keys() and type(loaded.lm_head) is nn.Linear
    for name, w in weights.items():
        assert torch.equal(w4[name].dequantized(), w), f"{name}: not the weights the checkpoint holds"
    held = loaded.state_dict()
    for name, t in model.state_dict().items():  # every other tensor as written, in bfloat16
        if name.rpartition(".")[0] not in weights:
            assert held[name].dtype == torch.bfloat16 and torch.equal(held[name], t), name
    if model.config.tie_word_embeddings:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


def test_unenabled_it_computes_transformers_model_over_those_weights_bit_for_bit(checkpoint):
    folder, model, weights = checkpoint
    loaded = hf.load_int4(folder, attn_implementation="eager")
    ids, mask = _prompt(True)
    with torch.no_grad():
        got = loaded(input_ids=ids, attention_mask=mask).logits
        want = _over(model, weights, torch.bfloat16)(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, want)


def test_enabled_logits_agree_at_prefill_and_every_decode_step_and_the_steps_replay(checkpoint, target):
    folder, model, weights = checkpoint
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(_over(model, weights, torch.float32), ids, mask)
    loaded = hf.AutoModelForCausalLM.from_pretrained(folder, target=target)
    report = loaded.tileops_report
    assert report.count("linear") == 2 * 7 + 1 and len(report.replaced["stacked projections"]) == 4
    assert {type(loaded.get_submodule(n)._tileops.gemm).__name__ for n in weights} == {"GemmW4A16FwdOp"}
    prefill, steps, _ = _teacher_forced(loaded, ids, mask, tokens)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, "prefill")
    for t in range(STEPS):
        _close(steps[t], ref_steps[t], torch.bfloat16, f"decode step {t}")
    replay = loaded.model._tileops.fused.replay
    assert replay.replays >= STEPS - 2 and not replay.refused  # the first step builds, the second captures
    assert any(d.startswith("GemmW4A16FwdOp: ") for d in replay.recording.graph.descriptions())


def test_greedy_generate_agrees_while_the_reference_is_sure(checkpoint, target):
    folder, model, weights = checkpoint
    ids, mask = _prompt(True)
    kw = dict(attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = _over(model, weights, torch.float32).generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
        loaded = hf.AutoModelForCausalLM.from_pretrained(folder, target=target)
        got = loaded.generate(ids, **kw)
    ref_logits = torch.stack(ref.logits)
    atol, rtol = TOL[torch.bfloat16]
    tol = atol + rtol * float(ref_logits.float().abs().max())
    confident = check_greedy_agreement(ref_logits, ref.sequences[:, ids.shape[1] :], got[:, ids.shape[1] :], tol)
    assert max(confident) > 0, "the reference was never sure: the test checked nothing"
    assert loaded.model._tileops.fused.replay.searched > 0  # the greedy loop ran in C++ over the replayed steps


def test_projections_of_two_kinds_or_two_group_sizes_run_unstacked(checkpoints, target):
    folder, _, weights = checkpoints["gptq-asym"]
    model = hf.load_int4(folder)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[1].mlp
    name = "model.layers.0.self_attn.k_proj"
    attn.k_proj = nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)  # a plain Linear beside 4-bit ones
    with torch.no_grad():
        attn.k_proj.weight.copy_(weights[name])
    packed, scale, zero = int4.quantize(weights["model.layers.1.mlp.up_proj"], group_size=64)
    mlp.up_proj = hf.W4A16Linear(packed, scale.half(), zero, group_size=64)  # its gate's groups are 32
    ids, mask = _prompt(True)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        report = hf.enable(model, target=target)
        got = model(input_ids=ids, attention_mask=mask).logits
    stacked = ["model.layers.0.mlp.gate_proj/up_proj", "model.layers.1.self_attn.q_proj/k_proj/v_proj"]
    assert report.replaced["stacked projections"] == stacked
    assert attn._tileops.qkv is None and mlp._tileops.gate_up is None
    _close(got[mask.bool()], want[mask.bool()], torch.bfloat16, "unstacked projections")


@pytest.mark.parametrize(
    "layout, quantization, tensors, refusal",
    [
        ("gptq-asym", {"bits": 8}, {}, r"bits=8 \(GemmW4A16FwdOp reads 4-bit weights\)"),
        ("gptq-asym", {"checkpoint_format": "marlin"}, {}, "GPTQ checkpoint in format 'marlin'"),
        (
            "gptq-asym",
            {"desc_act": True},
            {"model.layers.1.mlp.up_proj.g_idx": (torch.arange(64).flip(0) // 32).to(torch.int32)},
            r"model.layers.1.mlp.up_proj: from_gptq: act-order groups \(desc_act",
        ),
        ("awq", {"version": "gemv"}, {}, "AWQ checkpoint of version 'gemv'"),
        (
            "gptq-asym",
            {"group_size": 48},
            {},
            "model.layers.0.mlp.down_proj: group_size=48 does not divide its in_features 128",
        ),
    ],
    ids=["bits-8", "gptq-marlin", "act-order", "awq-gemv", "group-not-dividing-k"],
)
def test_what_is_not_served_is_refused_by_name(checkpoints, tmp_path, layout, quantization, tensors, refusal):
    folder = edit_checkpoint(checkpoints[layout][0], tmp_path / "edited", quantization, tensors)
    with pytest.raises(ValueError, match=refusal):
        hf.AutoModelForCausalLM.from_pretrained(folder)
