"""The moe family: the router's selection rule (ties, bias, renormalisation), the MoE
block on its decode and prefill paths against an eager loop, reading only the chosen
experts' weights, and a Qwen3-MoE sparse block of transformers run as FusedMoeFwdOp."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import run
from tileops_native_cpu import builders as b


def route(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, scoring: str, renormalize: bool):
    """float32 weights and int64 ids: selection on the logits (or sigmoid + bias), ties to the lower id."""
    logits = logits.float()
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    select = logits if bias is None else scores + bias
    ids = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    return (weights / weights.sum(-1, keepdim=True) if renormalize else weights), ids


def moe_loop(
    x, logits, w_gate_up, w_down, bias=None, *, top_k, scoring="softmax", renormalize=False, scale=1.0, act=F.silu
):
    """The block as an eager loop over the chosen experts, in float32."""
    weights, ids = route(logits, bias, top_k, scoring, renormalize)
    ffn = w_down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in ids.unique().tolist():
        token, slot = (ids == e).nonzero(as_tuple=True)
        gu = x[token].float() @ w_gate_up[e].float().T
        y = (act(gu[:, :ffn]) * gu[:, ffn:]) @ w_down[e].float().T
        out.index_add_(0, token, y * weights[token, slot, None])
    return out * scale


def moe_inputs(tokens, experts, hidden, ffn, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    logits = torch.randn(tokens, experts, generator=g)
    w_gate_up = (torch.randn(experts, 2 * ffn, hidden, generator=g) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, ffn, generator=g) / ffn**0.5).to(dtype)
    return x, logits, w_gate_up, w_down


def moe_params(experts, top_k, hidden, ffn, tokens, **more):
    return dict(num_tokens=tokens, num_experts=experts, top_k=top_k, hidden_size=hidden, ffn_size=ffn, **more)


# ---- the router ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_router_ties_go_to_the_lower_expert_id(dtype):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0, -1.0], [2.0] * 6, [0.0, 0.0, 1.0, 1.0, -2.0, 1.0]]).to(dtype)
    weights, ids = run(b.build_fused_topk, logits, None, top_k=3)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2], [2, 3, 5]]
    torch.testing.assert_close(weights, logits.float().softmax(-1).gather(1, ids.long()))


def test_a_correction_bias_moves_the_selection_but_the_weights_stay_unbiased():
    logits = torch.randn(64, 32)
    bias = torch.randn(32) * 2
    weights, ids = run(b.build_fused_topk, logits, bias, top_k=4, scoring_func="sigmoid")
    want_w, want_ids = route(logits, bias, 4, "sigmoid", False)
    assert torch.equal(ids.long(), want_ids)
    assert not torch.equal(want_ids, route(logits, None, 4, "sigmoid", False)[1])  # the bias did move it
    torch.testing.assert_close(weights, logits.sigmoid().gather(1, ids.long()))
    torch.testing.assert_close(weights, want_w)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_renormalised_router_weights_sum_to_one(scoring):
    logits = torch.randn(40, 128).bfloat16()
    weights, ids = run(b.build_fused_topk, logits, None, top_k=8, scoring_func=scoring, renormalize=True)
    want_w, want_ids = route(logits, None, 8, scoring, True)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights.sum(-1), torch.ones(40))
    torch.testing.assert_close(weights, want_w)


def test_the_router_builder_refuses_a_top_k_above_the_expert_count():
    with pytest.raises(ValueError, match=r"top_k must be at most the number of experts \(8\)"):
        run(b.build_fused_topk, torch.randn(2, 8), None, top_k=9)


# ---- the block -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 5, 33])
def test_the_block_matches_an_eager_loop_on_both_paths(dtype, tokens):
    experts, top_k, hidden, ffn = 16, 4, 96, 40
    x, logits, wgu, wd = moe_inputs(tokens, experts, hidden, ffn, dtype)
    out = run(
        b.build_fused_moe, x, logits, wgu, wd, None, **moe_params(experts, top_k, hidden, ffn, tokens, renormalize=True)
    )
    want = moe_loop(x, logits, wgu, wd, top_k=top_k, renormalize=True)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("tokens", [1, 4, 24])
def test_the_block_with_sigmoid_bias_scale_and_gelu(tokens):
    experts, top_k, hidden, ffn = 12, 3, 64, 48
    x, logits, wgu, wd = moe_inputs(tokens, experts, hidden, ffn, torch.bfloat16, seed=1)
    bias = torch.randn(experts)
    params = moe_params(
        experts,
        top_k,
        hidden,
        ffn,
        tokens,
        scoring_func="sigmoid",
        renormalize=True,
        routed_scaling_factor=2.5,
        activation="gelu_and_mul",
    )
    out = run(b.build_fused_moe, x, logits, wgu, wd, bias, **params)
    want = moe_loop(x, logits, wgu, wd, bias, top_k=top_k, scoring="sigmoid", renormalize=True, scale=2.5, act=F.gelu)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=4e-2)


@pytest.mark.parametrize("tokens", [1, 3, 4, 9])
def test_the_block_reads_only_the_chosen_experts_weights(tokens):
    experts, top_k, hidden, ffn = 32, 2, 64, 32
    x, logits, wgu, wd = moe_inputs(tokens, experts, hidden, ffn, torch.bfloat16)
    chosen = set(route(logits, None, top_k, "softmax", False)[1].flatten().tolist())
    idle = [e for e in range(experts) if e not in chosen]
    assert idle
    params = moe_params(experts, top_k, hidden, ffn, tokens)
    clean = run(b.build_fused_moe, x, logits, wgu, wd, None, **params)
    wgu, wd = wgu.clone(), wd.clone()
    wgu[idle] = float("nan")
    wd[idle] = float("nan")
    poisoned = run(b.build_fused_moe, x, logits, wgu, wd, None, **params)
    assert torch.isfinite(poisoned.float()).all()
    assert torch.equal(poisoned, clean)


def test_the_block_builder_refuses_weights_that_do_not_match_its_sizes():
    x, logits, wgu, wd = moe_inputs(2, 8, 32, 16, torch.bfloat16)
    with pytest.raises(ValueError, match=r"w_down must be \[8, 32, 16\]"):
        run(b.build_fused_moe, x, logits, wgu, wd[:, :, :8], None, **moe_params(8, 2, 32, 16, 2))


# ---- a Qwen3-MoE sparse block of transformers --------------------------------------------


def _qwen3_block(dtype):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (an optional test dependency)"
    )
    try:
        from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    except ImportError as error:
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3-MoE block: {error}")
    config = Qwen3MoeConfig(
        hidden_size=96,
        moe_intermediate_size=64,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        hidden_act="silu",
    )
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.05)
    return block.to(dtype), config


def _expert_weights(block, config):
    """[E, 2I, H] (gate rows, then up rows) and [E, H, I], from either layout of the block's experts."""
    experts = block.experts
    if isinstance(experts, torch.nn.ModuleList):  # one MLP per expert
        w_gate_up = torch.stack([torch.cat([m.gate_proj.weight, m.up_proj.weight]) for m in experts])
        w_down = torch.stack([m.down_proj.weight for m in experts])
    else:  # fused parameters of all experts
        w_gate_up, w_down = experts.gate_up_proj.data, experts.down_proj.data
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        if tuple(w_gate_up.shape) != (e, 2 * i, h) and tuple(w_gate_up.shape) == (e, h, 2 * i):
            w_gate_up, w_down = w_gate_up.transpose(1, 2), w_down.transpose(1, 2)
        assert tuple(w_gate_up.shape) == (e, 2 * i, h) and tuple(w_down.shape) == (e, h, i), (
            w_gate_up.shape,
            w_down.shape,
        )
    return w_gate_up.contiguous(), w_down.contiguous()


def _router_weight(block):
    gate = block.gate
    return gate.weight


@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("block_dtype", [torch.bfloat16, torch.float32])
def test_fused_moe_runs_a_qwen3_moe_sparse_block(tokens, block_dtype):
    """bfloat16: the block end to end in bfloat16, its router logits (a bfloat16 linear)
    handed over as float32, as its softmax reads them. float32: the block in float32 on
    bfloat16-representable weights and inputs, so the float32 routing is the block's own."""
    block, config = _qwen3_block(torch.bfloat16)
    block = block.to(block_dtype)
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, config.hidden_size, generator=g).bfloat16()
    with torch.no_grad():
        logits = F.linear(x.to(block_dtype), _router_weight(block)).float()
        top = logits.sort(-1, descending=True).values
        k = config.num_experts_per_tok
        assert (top[:, k - 1] > top[:, k]).all(), "a tie at the top-k boundary: pick another seed"
        result = block(x.to(block_dtype)[None])
        want = (result[0] if isinstance(result, tuple) else result)[0].float()
    w_gate_up, w_down = (w.bfloat16() for w in _expert_weights(block, config))
    params = moe_params(
        config.num_experts, k, config.hidden_size, config.moe_intermediate_size, tokens, renormalize=True
    )
    out = run(b.build_fused_moe, x, logits, w_gate_up, w_down, None, **params)
    scale = want.abs().max().item()
    rtol = 3e-2 if block_dtype == torch.bfloat16 else 1.6e-2
    torch.testing.assert_close(out.float(), want, rtol=rtol, atol=rtol * scale)
