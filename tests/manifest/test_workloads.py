"""Workloads: every op has them, and the cpu and small scales keep the rules, the links
between dims and the size budget."""

from __future__ import annotations

import math

import pytest

from tileops import manifest

from ._common import F16, F32, OPS, specs, workload


def test_every_op_has_workloads_and_full_cases_are_as_written() -> None:
    e = manifest.entry("GroupedQueryAttentionDecodeWithKVCacheFwdOp")
    shapes, params = workload(e, "qwen3-30b-a3b-bs1-kv256k", F16)
    assert shapes == {"q": (1, 32, 128), "k": (1, 262144, 4, 128), "v": (1, 262144, 4, 128)}
    assert params == {}
    c = manifest.entry("ClampFwdOp")
    assert workload(c, "square-4k-max-only", F32)[0]["min"] is None
    for e in manifest.all_entries().values():
        full = e.workload_cases("full")
        assert full, e.name
        assert len(full) == sum(len(w["dtypes"]) for w in e.workloads)


@pytest.mark.parametrize("op", OPS)
def test_cpu_workload_cases_satisfy_the_rules_and_the_size_budget(op: str) -> None:
    e = manifest.entry(op)
    cases = e.workload_cases("cpu")
    assert cases
    for name, shapes, params, dtype in cases:
        assert e.init_params(params) == params
        assert _largest_checked_tensor(e, shapes, params, dtype) <= 1 << 21, (name, shapes)


def _largest_checked_tensor(e, shapes: dict, params: dict, dtype) -> int:
    """The elements of a case's largest input or output, after checking its inputs
    against the entry's rules (which raise where the case breaks one)."""
    s = specs(e, shapes, dtype)
    e.check_inputs(s, params)
    sizes = [math.prod(v) for v in shapes.values() if v is not None]
    return max(sizes + [math.prod(shape) for _, shape in e.output_meta(s, params)])


def test_small_workload_cases_satisfy_the_rules_and_are_a_fraction_of_the_cpu_ones() -> None:
    largest = _largest_checked_tensor
    total = {"cpu": 0, "small": 0}
    for op in OPS:
        e = manifest.entry(op)
        cpu = {(n, d): largest(e, s, p, d) for n, s, p, d in e.workload_cases("cpu")}
        for name, shapes, params, dtype in e.workload_cases("small"):
            assert e.init_params(params) == params
            size = largest(e, shapes, params, dtype)
            assert size <= cpu[name, dtype], (op, name, shapes)
            total["small"] += size
            total["cpu"] += cpu[name, dtype]
    assert total["small"] * 4 <= total["cpu"], total


def test_cpu_scaling_keeps_divisibility_and_the_links_between_dims() -> None:
    bmm = {n: s for n, s, _, _ in manifest.entry("BmmFwdOp").workload_cases("cpu")}
    assert bmm["square-4k-b4"]["a"][2] % 16 == 0
    rms = {n: (s, p) for n, s, p, _ in manifest.entry("RMSNormFwdOp").workload_cases("cpu")}
    shapes, params = rms["llama-405b-prefill"]
    assert shapes["x"][-1] == shapes["weight"][0] == params["normalized_shape"][0] == 16384
    gqa = {n: s for n, s, _, _ in manifest.entry("GroupedQueryAttentionFwdOp").workload_cases("cpu")}
    q, k = gqa["llama-70b-long"]["q"], gqa["llama-70b-long"]["k"]
    assert (q[2], k[2], q[3]) == (64, 8, 128) and q[1] == k[1] < 2048


def test_workload_cases_rejects_an_unknown_scale() -> None:
    with pytest.raises(ValueError, match="'cpu', 'small', 'tiny' or 'full'"):
        manifest.entry("ReluFwdOp").workload_cases("gpu")
