"""The harness's index inputs: varied for the numeric checks (uneven requests, partly
filled page tables), and with full=True the shapes a manifest roofline assumes (requests
equally long, every block table full), which `tileops bench` times."""

from __future__ import annotations

import pytest
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
    case = harness.Case(
        "GroupedQueryAttentionDecodePagedWithKVCacheFwdOp",
        "test",
        shapes,
        dict(page_size=16, sm_scale=None, softcap=None, window_size_left=-1),
        torch.bfloat16,
        None,
        "cpu",
    )
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


def test_cases_leave_out_shapes_where_no_block_table_keeps_the_writes_apart():
    op = "GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp"
    entry = manifest.entry(op)
    every = [harness.Case(op, n, s, p, d, None, "cpu") for n, s, p, d in entry.workload_cases("tiny")]
    # shrunk to a few hundred elements, one page of 16 rows is left for four requests' chunks
    short = [c for c in every if not harness.writes_fit(entry, c.shapes, c.params)]
    assert {c.workload for c in short} >= {"chunks-window20"}
    kept = harness.cases(None, ops=[op], scale="tiny")
    assert not {c.workload for c in short} & {c.workload for c in kept} and kept
    with pytest.raises(ValueError, match=f"{op}: its requests need .* pages of 16 tokens, and the cache holds 1"):
        harness.make_inputs(next(c for c in short if c.workload == "chunks-window20"))
    # what is kept gets tables whose written rows are all distinct
    for case in kept + harness.cases(None, ops=[op]):
        args = dict(zip(entry.input_names(), harness.make_inputs(case)))
        page = case.params["page_size"]
        rows = [
            int(args["block_table"][b, t // page]) * page + t % page
            for b in range(len(args["cache_seqlens"]))
            for t in range(
                int(args["cache_seqlens"][b]),
                int(args["cache_seqlens"][b]) + int(args["cu_seqlens_q"][b + 1] - args["cu_seqlens_q"][b]),
            )
        ]
        assert len(rows) == len(set(rows)), case
