"""The ops a Hugging Face model runs on (tileops.integrations.transformers), beyond what
``tileops check torch_cpu`` compares with the references: the paged prefill writes the
caller's pools in place and a decode step sees everything cached before it; packed
requests attend on their own; partial rotary leaves the trailing channels alone; the
router breaks ties toward the lower expert; kernels record no autograd graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tileops.backend import registered_targets
from tileops.ops import (
    AddFwdOp,
    FusedAddRMSNormFwdOp,
    FusedMoeFwdOp,
    FusedTopKOp,
    GeluAndMulFwdOp,
    GeluTanhAndMulFwdOp,
    GemmFwdOp,
    GroupedQueryAttentionPrefillFwdOp,
    GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp,
    RopeLlama31PositionIdsFwdOp,
    RopeLongRopePositionIdsFwdOp,
    RopeNeoxPositionIdsFwdOp,
    SiluAndMulFwdOp,
)
from tileops.serving import PagedKVCache

TARGET = "torch_cpu"  # named, so the suite also runs where another CPU backend is installed
BF16_TOL = dict(rtol=2e-2, atol=2e-2)  # the conformance harness's bfloat16 tolerance

# What tileops.integrations.transformers constructs for the architectures it serves.
MODEL_OPS = [
    "GemmFwdOp",
    "AddFwdOp",
    "RMSNormFwdOp",
    "FusedAddRMSNormFwdOp",
    "SiluAndMulFwdOp",
    "GeluTanhAndMulFwdOp",
    "RopeNeoxPositionIdsFwdOp",
    "RopeLlama31PositionIdsFwdOp",
    "RopeLongRopePositionIdsFwdOp",
    "GroupedQueryAttentionPrefillFwdOp",
    "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp",
    "FusedTopKOp",
    "FusedMoeFwdOp",
]


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def test_every_op_the_transformers_integration_uses_has_a_torch_cpu_builder():
    assert [op for op in MODEL_OPS if TARGET not in registered_targets(op)] == []


# ---- attention -----------------------------------------------------------------------


def _varlen(lengths, **params):
    """A varlen prefill op for requests of these lengths, and its offsets."""
    longest = max(lengths)
    op = GroupedQueryAttentionPrefillFwdOp(longest, longest, target=TARGET, **params)
    return op, PagedKVCache.cu_seqlens(lengths)


def test_packed_requests_each_attend_only_to_their_own_keys():
    lengths = [3, 7, 5]
    q, k, v = _randn(15, 4, 16, seed=1), _randn(15, 2, 16, seed=2), _randn(15, 2, 16, seed=3)
    op, cu = _varlen(lengths)
    packed = op(q, k, v, cu, cu)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        alone, one = _varlen([n])
        assert torch.equal(packed[rows], alone(q[rows], k[rows], v[rows], one, one))
        start += n


def test_a_causal_request_equals_scaled_dot_product_attention_with_grouped_heads():
    q, k, v = _randn(9, 4, 16, seed=1), _randn(9, 2, 16, seed=2), _randn(9, 2, 16, seed=3)
    op, cu = _varlen([9])
    expected = F.scaled_dot_product_attention(
        *(t.float().transpose(0, 1) for t in (q, k, v)), is_causal=True, enable_gqa=True
    ).transpose(0, 1)
    torch.testing.assert_close(op(q, k, v, cu, cu).float(), expected, **BF16_TOL)


def test_a_query_that_sees_no_key_gets_zeros():
    # 4 queries against 2 keys, bottom-right aligned: queries 0 and 1 sit before every key
    q, k, v = _randn(4, 2, 8, seed=1), _randn(2, 2, 8, seed=2), _randn(2, 2, 8, seed=3)
    op = GroupedQueryAttentionPrefillFwdOp(4, 4, target=TARGET)
    out = op(q, k, v, PagedKVCache.cu_seqlens([4]), PagedKVCache.cu_seqlens([2]))
    assert torch.equal(out[:2], torch.zeros(2, 2, 8, dtype=torch.bfloat16))
    assert out[2:].abs().sum() > 0


def _paged_op(cache, window=-1):
    return GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(
        cache.max_pages_per_seq, cache.page_size, 16, window_size_left=window, target=TARGET
    )


def _chunk(cache, op, seqs, counts, q, k, v):
    """One serving step: reserve the chunks, call the op on the old lengths, advance."""
    cache.reserve(seqs, counts)
    out = op(
        q,
        k,
        v,
        cache.k_pages,
        cache.v_pages,
        None,
        None,
        PagedKVCache.cu_seqlens(counts),
        cache.seqlens(seqs),
        cache.block_table(seqs),
    )
    cache.advance(seqs, counts)
    return out


def test_the_paged_prefill_writes_each_chunk_into_the_callers_pools_in_place():
    cache = PagedKVCache(num_pages=8, page_size=4, heads_kv=2, head_dim=8, max_pages_per_seq=4)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a, b], _randn(5, 2, 8), _randn(5, 2, 8), counts=[2, 3])  # already cached
    k_pool, v_pool = cache.k_pages, cache.v_pages
    before_k, before_v = k_pool.clone(), v_pool.clone()
    k_new, v_new = _randn(7, 2, 8, seed=4), _randn(7, 2, 8, seed=5)

    _chunk(cache, _paged_op(cache), [a, b], [3, 4], _randn(7, 4, 8, seed=6), k_new, v_new)

    assert cache.k_pages is k_pool and cache.v_pages is v_pool  # the same tensors, written
    written = torch.cat([cache.rows(a)[2:], cache.rows(b)[3:]])
    assert torch.equal(k_pool[written], k_new) and torch.equal(v_pool[written], v_new)
    untouched = torch.ones(k_pool.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(k_pool[untouched], before_k[untouched])
    assert torch.equal(v_pool[untouched], before_v[untouched])


@pytest.mark.parametrize("window", [-1, 3], ids=["no-window", "window-3"])
def test_a_prefill_then_decode_steps_attend_as_one_prefill_over_the_whole_sequence(window):
    """Chunked prefill and one-token decode steps through the cache give the rows a single
    varlen prefill over every token gives (what a model's logits rely on)."""
    total, prompt = 11, 6
    q, k, v = _randn(total, 4, 8, seed=1), _randn(total, 2, 8, seed=2), _randn(total, 2, 8, seed=3)
    cache = PagedKVCache(num_pages=4, page_size=4, heads_kv=2, head_dim=8, max_pages_per_seq=4)
    seq = cache.add_sequence()
    op = _paged_op(cache, window)
    rows = [_chunk(cache, op, [seq], [prompt], q[:prompt], k[:prompt], v[:prompt])]
    for t in range(prompt, total):  # each decode step is a chunk of one token
        rows.append(_chunk(cache, op, [seq], [1], q[t : t + 1], k[t : t + 1], v[t : t + 1]))
    whole, cu = _varlen([total], window_size_left=window)
    # the same math over other matrix shapes: equal to float32 rounding, then bfloat16's
    torch.testing.assert_close(torch.cat(rows), whole(q, k, v, cu, cu), **BF16_TOL)


# ---- RoPE ----------------------------------------------------------------------------


def test_partial_rotary_rotates_the_leading_channels_and_passes_the_rest_through():
    x, positions = _randn(5, 3, 16), torch.tensor([0, 1, 7, 30, 63])
    partial = RopeNeoxPositionIdsFwdOp(64, rotary_dim=8, target=TARGET)(x, positions)
    whole_head_of_8 = RopeNeoxPositionIdsFwdOp(64, rotary_dim=8, target=TARGET)
    assert torch.equal(partial[..., 8:], x[..., 8:])
    assert torch.equal(partial[..., :8], whole_head_of_8(x[..., :8].contiguous(), positions))


def test_rope_rotates_as_transformers_rotate_half_does():
    x, positions, base = _randn(6, 2, 16, dtype=torch.float32), torch.arange(6) * 5, 500.0
    inv_freq = 1.0 / (base ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    angles = torch.cat([positions[:, None].float() * inv_freq] * 2, dim=-1)[:, None, :]
    rotate_half = torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
    expected = x * angles.cos() + rotate_half * angles.sin()
    got = RopeNeoxPositionIdsFwdOp(32, base, rotary_dim=16, target=TARGET)(x, positions)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_three_rope_ops_differ_only_in_their_frequencies():
    x, positions = _randn(4, 2, 16, dtype=torch.float32), torch.tensor([3, 1, 40, 9])
    plain = RopeNeoxPositionIdsFwdOp(128, rotary_dim=12, target=TARGET)(x, positions)
    # LongRoPE with every factor 1 and no stretch is plain; with factors 2, position 2p
    # turns by what position p turns without them
    assert torch.equal(RopeLongRopePositionIdsFwdOp(128, rotary_dim=12, target=TARGET)(x, positions), plain)
    halved = RopeLongRopePositionIdsFwdOp(128, rotary_dim=12, rescale_factors=[2.0] * 6, target=TARGET)
    assert torch.equal(halved(x, positions * 2), plain)
    # Llama 3.1 scales the wavelengths longer than original_max_position / high_freq_factor:
    # the longest of these 6 (about 13.5k) for the default 8192, none for 2**20
    llama31 = RopeLlama31PositionIdsFwdOp(128, rotary_dim=12, target=TARGET)
    assert not torch.equal(llama31(x, positions), plain)
    unscaled = RopeLlama31PositionIdsFwdOp(128, rotary_dim=12, original_max_position=1 << 20, target=TARGET)
    assert torch.equal(unscaled(x, positions), plain)


# ---- norms and elementwise -----------------------------------------------------------


def test_fused_add_rms_norm_returns_the_norm_of_the_rounded_sum_and_the_sum():
    x, residual, weight = _randn(3, 32, seed=1), _randn(3, 32, seed=2), _randn(32, seed=3)
    out, total = FusedAddRMSNormFwdOp(1e-5, target=TARGET)(x, residual, weight)
    assert torch.equal(total, x + residual)
    assert torch.equal(out, F.rms_norm(x + residual, (32,), weight, 1e-5))


def test_add_broadcasts_other_and_scales_it_by_alpha():
    x, bias = _randn(4, 8, seed=1), _randn(8, seed=2)
    assert torch.equal(AddFwdOp(alpha=0.5, target=TARGET)(x, bias), torch.add(x, bias, alpha=0.5))
    a, b = torch.arange(6, dtype=torch.int32).view(2, 3), torch.tensor([1, 2, 3], dtype=torch.int32)
    assert torch.equal(AddFwdOp(alpha=3, target=TARGET)(a, b), a + 3 * b)


@pytest.mark.parametrize(
    "op, activation",
    [
        (SiluAndMulFwdOp, F.silu),
        (GeluTanhAndMulFwdOp, lambda g: F.gelu(g, approximate="tanh")),
        (GeluAndMulFwdOp, F.gelu),
    ],
    ids=["silu", "gelu_tanh", "gelu"],
)
def test_a_gated_activation_takes_the_gate_first_and_the_value_second(op, activation):
    x = _randn(3, 10)
    gate, value = x.float()[:, :5], x.float()[:, 5:]
    assert torch.equal(op(target=TARGET)(x), (activation(gate) * value).to(torch.bfloat16))


# ---- mixture of experts --------------------------------------------------------------


def test_the_router_breaks_a_tie_toward_the_lower_expert_id():
    logits = torch.tensor([[0.5, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    weights, ids = FusedTopKOp(top_k=2, target=TARGET)(logits)
    assert ids.tolist() == [[1, 2], [0, 1]] and ids.dtype == torch.int32
    assert torch.equal(weights[1], torch.tensor([0.25, 0.25]))


def test_a_correction_bias_moves_the_choice_but_not_the_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    weights, ids = FusedTopKOp(top_k=1, scoring_func="sigmoid", target=TARGET)(logits, bias)
    assert ids.tolist() == [[3]]
    torch.testing.assert_close(weights, torch.sigmoid(logits[:, 3:]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("activation", ["silu_and_mul", "gelu_and_mul"])
def test_fused_moe_sums_each_tokens_chosen_experts_by_their_routing_weights(activation):
    tokens, experts, top_k, hidden, ffn = 5, 4, 2, 16, 8
    x, logits = _randn(tokens, hidden, seed=1), _randn(tokens, experts, dtype=torch.float32)
    w_gate_up = (_randn(experts, 2 * ffn, hidden, seed=2).float() / 4).bfloat16()
    w_down = (_randn(experts, hidden, ffn, seed=3).float() / 3).bfloat16()
    moe = FusedMoeFwdOp(
        8,
        experts,
        top_k,
        hidden,
        ffn,
        renormalize=True,
        routed_scaling_factor=1.5,
        activation=activation,
        target=TARGET,
    )
    out = moe(x, logits, w_gate_up, w_down, None)  # 5 tokens through an op built for 8
    weights, ids = FusedTopKOp(top_k=top_k, renormalize=True, target=TARGET)(logits)
    act = F.silu if activation == "silu_and_mul" else F.gelu
    expected = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (x[t].float() @ w_gate_up[e].float().T).split(ffn)
            expected[t] += w * ((act(gate) * up) @ w_down[e].float().T)
    torch.testing.assert_close(out.float(), 1.5 * expected, **BF16_TOL)


# ---- autograd --------------------------------------------------------------------------


def test_kernels_record_no_autograd_graph_even_when_inputs_require_grad():
    weight = _randn(6, 8).requires_grad_()
    y = GemmFwdOp(target=TARGET)(_randn(3, 8), weight)
    assert not y.requires_grad and y.grad_fn is None
    # a pool written from grad-requiring keys stays a plain tensor, step after step
    cache = PagedKVCache(num_pages=2, page_size=4, heads_kv=2, head_dim=8)
    seq = cache.add_sequence()
    k = _randn(3, 2, 8).requires_grad_()
    _chunk(cache, _paged_op(cache), [seq], [3], _randn(3, 4, 8), k, k.detach())
    assert not cache.k_pages.requires_grad and cache.k_pages.grad_fn is None
