"""Attention ops fix their dims at construction; sm_scale and softcap are constructor
arguments, not manifest params, so an external target is never asked to honour them."""

from __future__ import annotations

import pytest
import torch

from tileops.backend import OpNotAvailableError
from tileops.ops import GroupedQueryAttentionDecodeWithKVCacheFwdOp, GroupedQueryAttentionFwdOp

Decode = GroupedQueryAttentionDecodeWithKVCacheFwdOp


def decode_inputs(n_kv: int = 6):
    q = torch.randn(2, 4, 8, dtype=torch.float16)
    k = torch.randn(2, n_kv, 2, 8, dtype=torch.float16)
    return q, k, torch.randn_like(k)


def test_constructor_dims_are_validated():
    with pytest.raises(ValueError, match="heads must be a multiple of heads_kv"):
        GroupedQueryAttentionFwdOp(1, 6, 4, 16, 8)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        Decode(0, 4, 2, 16, 8)
    with pytest.raises(ValueError, match="softcap must be a non-negative"):
        Decode(2, 4, 2, 16, 8, softcap=-1.0)


def test_a_call_with_other_shapes_than_constructed_is_rejected(cpu_target):
    op = GroupedQueryAttentionFwdOp(1, 4, 2, 16, 8)
    q = torch.randn(1, 8, 4, 8, dtype=torch.float16)
    k = torch.randn(1, 8, 2, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"with seq_len=16, but this call has q.shape\[1\] = 8"):
        op(q, k, k)
    assert cpu_target.builds == []


def test_decode_accepts_any_cache_length_up_to_the_constructed_one(cpu_target):
    op = Decode(2, 4, 2, 16, 8)
    for n_kv in (1, 6, 16):
        assert op(*decode_inputs(n_kv)).shape == (2, 4, 8)
    with pytest.raises(ValueError, match=r"with seqlen_kv=16, the most k.shape\[1\] may be"):
        op(*decode_inputs(17))


def test_a_non_default_softmax_scale_is_refused_by_an_external_target(cpu_target):
    op = Decode(2, 4, 2, 16, 8, sm_scale=0.5)
    with pytest.raises(OpNotAvailableError, match="sm_scale=0.5"):
        op(*decode_inputs())
    assert cpu_target.builds == []


def test_the_default_scale_written_out_is_still_the_default(cpu_target):
    op = Decode(2, 4, 2, 16, 8, sm_scale=8**-0.5, softcap=0.0)
    assert op(*decode_inputs()).shape == (2, 4, 8)
