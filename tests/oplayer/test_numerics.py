"""The numeric harness (E8) over every op with a recording target whose kernels are the
references: it checks the plumbing (specs, params, slots, outputs) end to end, and is the
same harness a backend runs against its own kernels."""

from __future__ import annotations

import pytest

from tileops import manifest
from tileops.testing import harness

CASES = harness.cases(None)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_op_matches_its_reference_through_a_target(case, cpu_target):
    harness.check(case.__class__(**{**case.__dict__, "target": cpu_target.name}))


def test_the_harness_covers_every_op_with_workloads_and_edge_cases():
    ops = {c.op for c in CASES}
    assert ops == set(manifest.all_entries())
    assert {c.workload for c in CASES} >= {"strided", "odd", "one-row"}


def test_the_harness_catches_a_wrong_kernel(cpu_target):
    from tileops.backend import register_detector, register_kernel_builder

    register_detector("wrong", lambda d: d.type == "meta")
    case = harness.cases(None, ops=["SoftmaxFwdOp"], edge_cases=False)[0]
    register_kernel_builder("SoftmaxFwdOp", "wrong", lambda x, *, dim: lambda x: (x * 2).softmax(dim))
    broken = case.__class__(**{**case.__dict__, "target": "wrong", "device": "cpu"})
    # "wrong" does not claim cpu, but target= names it explicitly: its kernel runs.
    with pytest.raises(AssertionError, match="max abs error"):
        harness.check(broken)
