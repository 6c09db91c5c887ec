"""The harness's index inputs: varied for the numeric checks (uneven requests, partly
filled page tables), and with full=True the shapes a manifest roofline assumes (requests
equally long, every block table full), which `tileops bench` times."""

from __future__ import annotations

import torch

from tileops import manifest
from tileops.backend import TensorSpec
from tileops.testing import harness


def _case(op: str) -> harness.Case:
    return next(c for c in harness.cases(None, ops=[op], scale="tiny") if not c.strided)


def _inputs(case: harness.Case, full: bool) -> dict[str, torch.Tensor]:
    return dict(zip(manifest.entry(case.op).input_names(), harness.make_inputs(case, full=full)))


def test_full_index_inputs_fill_every_block_table_and_vary_otherwise():
    # 4 sequences, block tables of 8 pages of 16, a cache of 16 pages: room for 64 each
    shapes = dict(q=(4, 8, 16), k=(256, 2, 16), v=(256, 2, 16), real_seqlen_kv=(4,), block_table=(4, 8))
    case = harness.Case("GroupedQueryAttentionDecodePagedWithKVCacheFwdOp", "test", shapes,
                        dict(page_size=16, sm_scale=None, softcap=None, window_size_left=-1), torch.bfloat16, None, "cpu")
    full, varied = _inputs(case, True), _inputs(case, False)
    assert full["real_seqlen_kv"].tolist() == [64] * 4
    assert sorted(full["block_table"][:, :4].flatten().tolist()) == list(range(16))  # every page used once
    assert varied["real_seqlen_kv"].tolist() != [64] * 4  # the numeric checks see other lengths
    # the roofline counts the K and V these inputs hold (4 x 64 tokens x 2 heads x 16, bf16,
    # twice), not the tables' 128 tokens each, plus q, o and the index tensors
    specs = [TensorSpec(t.device, t.dtype, tuple(t.shape)) for t in full.values()]
    _, nbytes = manifest.entry(case.op).roofline(specs, case.params)
    assert nbytes == 2 * 4 * 64 * 2 * 16 * 2 + 2 * 4 * 8 * 16 * 2 + 4 * 4 + 4 * 4 * 8


def test_full_offsets_split_their_rows_evenly():
    cu = _inputs(_case("GroupedQueryAttentionPrefillFwdOp"), True)["cu_seqlens_q"].tolist()
    spans = [b - a for a, b in zip(cu, cu[1:])]
    assert max(spans) - min(spans) <= 1 and cu[0] == 0
