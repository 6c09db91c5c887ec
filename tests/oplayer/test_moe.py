"""The MoE ops' promises at the op layer: what the router refuses before any kernel, and
what its reference (the rule every backend is judged by) does with ties, biases and
renormalisation."""

from __future__ import annotations

import pytest
import torch

from tileops.ops.moe.fused_moe import FusedMoeFwdOp
from tileops.ops.moe.fused_topk import FusedTopKOp
from tileops.testing.references import reference


def test_a_top_k_above_the_expert_count_is_refused_naming_both_before_any_kernel(cpu_target):
    op = FusedTopKOp(top_k=9, target=cpu_target.name)
    with pytest.raises(ValueError, match=r"top_k <= gating_output.shape\[1\]") as info:
        op(torch.randn(4, 8))
    assert "top_k=9" in str(info.value) and "(4, 8)" in str(info.value)
    assert cpu_target.builds_of("FusedTopKOp") == []


def test_the_router_needs_a_top_k_of_at_least_one():
    with pytest.raises(ValueError, match="top_k is not None"):
        FusedTopKOp()
    with pytest.raises(ValueError, match="top_k >= 1"):
        FusedTopKOp(top_k=0)


def test_a_correction_bias_needs_sigmoid_scores(cpu_target):
    op = FusedTopKOp(top_k=2, target=cpu_target.name)
    with pytest.raises(ValueError, match="scoring_func == 'sigmoid'"):
        op(torch.randn(3, 8), torch.zeros(8))
    assert cpu_target.builds_of("FusedTopKOp") == []


def test_the_moe_block_refuses_more_tokens_than_it_was_built_for_and_serves_fewer(cpu_target):
    e, h, f = 4, 8, 6
    op = FusedMoeFwdOp(2, e, 2, h, f, target=cpu_target.name)
    weights = (torch.randn(e, 2 * f, h).bfloat16(), torch.randn(e, h, f).bfloat16())
    with pytest.raises(ValueError, match=r"hidden_states.shape\[0\] <= num_tokens"):
        op(torch.randn(3, h).bfloat16(), torch.randn(3, e), *weights)
    assert op(torch.randn(1, h).bfloat16(), torch.randn(1, e), *weights).shape == (1, h)


def test_router_ties_go_to_the_lower_expert_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]]).bfloat16()
    weights, ids = reference("FusedTopKOp")(logits, None, top_k=3, scoring_func="softmax", renormalize=False)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32


def test_a_correction_bias_moves_the_selection_but_not_the_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    weights, ids = reference("FusedTopKOp")(logits, bias, top_k=2, scoring_func="sigmoid", renormalize=False)
    assert ids.tolist() == [[3, 0]]  # expert 3 only through its bias
    torch.testing.assert_close(weights, logits.sigmoid()[:, [3, 0]])


def test_renormalised_weights_sum_to_one_and_keep_their_ratios():
    logits = torch.randn(6, 16)
    ref = reference("FusedTopKOp")
    plain, ids = ref(logits, None, top_k=4, scoring_func="softmax", renormalize=False)
    normed, same_ids = ref(logits, None, top_k=4, scoring_func="softmax", renormalize=True)
    assert torch.equal(ids, same_ids)
    torch.testing.assert_close(normed.sum(-1), torch.ones(6))
    torch.testing.assert_close(normed, plain / plain.sum(-1, keepdim=True))
