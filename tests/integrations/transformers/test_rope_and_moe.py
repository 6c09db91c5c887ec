"""The pieces with a rule of their own, each against transformers' own module: every
RoPE scaling's rotation (and YaRN's and LongRoPE's factor on cos and sin), the MoE
routers (Qwen3-MoE's, Qwen2-MoE's, Mixtral's, ties included) and the experts on both
paths of their op.
"""

from __future__ import annotations

import pytest
import torch

from ._models import TOL, _close, _config, _model, _prompt, _teacher_forced, hf


@pytest.mark.parametrize("kind", ["linear", "dynamic", "longrope", "llama3", "yarn"])
def test_each_rope_type_rotates_as_transformers_rotary_embedding(kind, target):
    """The op of each attention layer against transformers' own rotary module and
    apply_rotary_pos_emb, on a call within original_max_position_embeddings and one past
    it (LongRoPE's short and long factors), and on positions where the scaling matters.
    The factor on cos and sin (YaRN's, LongRoPE's) is folded into the attention scale."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

    arch = {"linear": "llama_linear", "longrope": "llama_longrope", "llama3": "llama31", "yarn": "llama_yarn"}
    arch = arch.get(kind, "llama")
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
    extra = {"rope_parameters": dynamic} if kind == "dynamic" else {}
    model = _model(arch, **extra)
    rotary = model.model.rotary_emb
    plain = _model("llama").model.rotary_emb
    hf.enable(model, target=target)
    st = model.model.layers[0].self_attn._tileops
    rope = lambda x, pos: st.rope(x, pos) * st.rope_gain  # noqa: E731  (the gain is left to the attention scale)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(24, 4, 16, generator=gen).to(torch.bfloat16)  # [T, H, D]

    def rotated(x, cos, sin):  # transformers' apply_rotary_pos_emb on [T, H, D] as its [1, H, T, D]
        heads_first = x.transpose(0, 1)[None]
        return apply_rotary_pos_emb(heads_first, heads_first, cos, sin)[0][0].transpose(0, 1)

    for pos in (torch.arange(16), torch.arange(200, 224)):  # all within 16 (LongRoPE: short), then past it (long)
        xs = x[: pos.numel()].contiguous()
        want = rotated(xs, *rotary(xs, pos[None]))
        _close(rope(xs, pos), want, torch.bfloat16, f"{kind} at positions {int(pos[0])}..")
        if kind != "dynamic" and int(pos[0]) > 0:  # the scaling matters here: plain RoPE is far off
            assert (rotated(xs, *plain(xs, pos[None])).float() - want.float()).abs().max() > 0.5


@pytest.mark.parametrize("arch", ["llama_yarn", "llama_longrope"])
def test_the_factor_on_cos_and_sin_reaches_the_attention_scores(arch, target):
    """YaRN's and LongRoPE's factor on cos and sin (folded into the attention scale) on a
    model whose attention is sharp enough for it to matter: q and k projections x 8."""

    def sharp(attention_factor=None):
        rope = {**_config(arch).rope_parameters}
        if attention_factor is not None:
            rope["attention_factor"] = attention_factor
        model = _model(arch, rope_parameters=rope)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(8)
                layer.self_attn.k_proj.weight.mul_(8)
        return model

    model = sharp()
    ids, mask = _prompt(True)
    ref_prefill, ref_steps, tokens = _teacher_forced(model, ids, mask, steps=4)
    unscaled = _teacher_forced(sharp(1.0), ids, mask, tokens, steps=4)[0]
    atol, rtol = TOL[torch.bfloat16]
    assert (unscaled - ref_prefill)[mask.bool()].abs().max() > 5 * (atol + rtol * ref_prefill.abs().max())
    hf.enable(model, target=target)
    assert model.model.layers[0].self_attn._tileops.rope_gain > 1.1
    prefill, steps, _ = _teacher_forced(model, ids, mask, tokens, steps=4)
    _close(prefill[mask.bool()], ref_prefill[mask.bool()], torch.bfloat16, f"{arch} prefill")
    _close(steps, ref_steps, torch.bfloat16, f"{arch} decode")


# ---- MoE: the routers and the experts -----------------------------------------------------


ROUTERS = {  # (arch, config changes, renormalised, the weights' dtype)
    "qwen3-renormalised": ("qwen3_moe", {"norm_topk_prob": True}, True, torch.bfloat16),
    "qwen3": ("qwen3_moe", {"norm_topk_prob": False}, False, torch.bfloat16),
    "qwen2": ("qwen2_moe", {}, False, torch.bfloat16),
    "mixtral": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2}, True, torch.float32),
}


@pytest.mark.parametrize("router_kind", list(ROUTERS))
def test_the_router_selects_and_weighs_as_transformers_router_ties_included(router_kind, target):
    """FusedTopKOp against the router's own forward (Qwen3-MoE's, Qwen2-MoE's, Mixtral's):
    the same ids, and the same weights (renormalised or not; bfloat16, or float32 for
    Mixtral). Experts 3 and 5 have the same router row, so their logits tie on every token:
    where they meet at the k-th place, the pick is torch.topk's."""
    arch, extra, renormalised, dtype = ROUTERS[router_kind]
    model = _model(arch, **extra)
    router = model.model.layers[0].mlp.gate
    with torch.no_grad():
        router.weight[5] = router.weight[3]
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        want_logits, want_w, want_ids = type(router).forward(router, x)
        report = hf.enable(model, target=target)
        logits, w, ids = router(x)
    assert report.count("moe router") >= 1 and "forward" in router.__dict__
    one_of_the_pair = (want_ids == 3).any(1) ^ (want_ids == 5).any(1)  # the tie sits at the k-th place
    assert int(one_of_the_pair.sum()) >= 3, "no tie at the k-th place: the test checked nothing"
    assert ids.dtype == want_ids.dtype and w.dtype == want_w.dtype == dtype
    # the same experts with the same weights (two tied ones both chosen may come in either order)
    mine, theirs = ids.sort(1), want_ids.sort(1)
    assert torch.equal(mine.values, theirs.values)
    torch.testing.assert_close(logits, want_logits, rtol=0.02, atol=0.02)
    torch.testing.assert_close(
        w.gather(1, mine.indices).float(), want_w.gather(1, theirs.indices).float(), rtol=2**-8, atol=0
    )  # at most one bfloat16 step
    if renormalised:
        torch.testing.assert_close(w.float().sum(1), torch.ones(64), rtol=0.01, atol=0)


@pytest.mark.parametrize("tokens", [1, 3, 40])  # the op's decode path (<= 4 tokens) and its prefill path
def test_the_experts_run_the_routing_they_are_given(tokens, target):
    model = _model("qwen3_moe")
    experts = model.model.layers[0].mlp.experts
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 64, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(tokens)])
    w = torch.rand(tokens, 2, generator=gen).to(torch.bfloat16)
    w[0] = torch.tensor([1.0, 0.0])  # the ends of [0, 1]: a weight of one and a chosen expert of weight zero
    with torch.no_grad():
        want = experts(x, ids, w)  # eager: the reference's experts_implementation
        hf.enable(model, target=target)
        assert model.config._experts_implementation == "tileops"
        got = experts(x, ids, w)
    _close(got, want, torch.bfloat16, f"experts on {tokens} tokens")
    # the routing reaches the op exactly: the same experts, the weights to float32 rounding
    from tileops import ops  # noqa: PLC0415

    got_w, got_ids = ops.FusedTopKOp(num_experts=8, top_k=2, scoring_func="sigmoid", target=target)(
        hf.moe.routing_as_logits(ids, w, 8)
    )
    order = got_ids.long().sort(1)
    assert torch.equal(order.values, ids.sort(1).values)
    torch.testing.assert_close(
        got_w.gather(1, order.indices), w.float().gather(1, ids.sort(1).indices), rtol=1e-5, atol=1e-30
    )


def test_the_moe_block_weighs_in_the_logits_of_the_test_config():
    """Without its experts the reference's logits move far past the tolerance: the
    equivalence tests of qwen3_moe check the MoE path, not only what is around it."""
    model = _model("qwen3_moe")
    ids, mask = _prompt(False)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        model.model.layers[0].mlp.experts.down_proj.zero_()
        without = model(input_ids=ids, attention_mask=mask).logits
    atol, rtol = TOL[torch.bfloat16]
    assert (full - without).abs().max() > 10 * (atol + rtol * full.abs().max())
